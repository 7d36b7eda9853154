# The dradriver kubelet plugin image. Build: docker build -t dradriver:dev .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
ENV GRPC_VERBOSITY=ERROR PYTHONUNBUFFERED=1
ENTRYPOINT ["dradriver"]
CMD ["run"]
