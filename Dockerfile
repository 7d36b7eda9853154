# The dradriver kubelet plugin image: `docker build -t dradriver:dev .` (docs/deployment.md, "Image").
# Two stages: the first builds wheels for dradriver and all its dependencies; the final image installs only
# those wheels (no index, no compiler, no pip left behind). NVML, nvidia-smi and nvidia-cuda-mps-control are
# not in the image: they come from the node's driver root, mounted at /driver-root. CDI specs are written by
# the driver itself, so no nvidia-ctk either.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="dradriver" \
      org.opencontainers.image.description="Kubernetes DRA kubelet plugin for NVIDIA GPUs" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="dradriver"
COPY --from=build /wheels /wheels
# Only the wheels built above; then pip, setuptools and wheel go too: nothing can build or fetch code here.
RUN pip install --no-cache-dir --no-index --find-links=/wheels "dradriver==${VERSION}" \
    && rm -rf /wheels \
    && pip uninstall --no-cache-dir -y pip setuptools wheel
ENV GRPC_VERBOSITY=ERROR \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
ENTRYPOINT ["dradriver"]
CMD ["run"]
