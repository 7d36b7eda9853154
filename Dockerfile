# The dradriver kubelet plugin image. scripts/build-image builds it with podman, base included, from Debian's
# packages and an OCI archive for containerd (docs/image.md); `docker build .` works wherever the base can be
# pulled, after `cp "$(scripts/build-cdi-hook)" build/nvidia-cdi-hook`.
# Two stages: the first installs dradriver and its dependencies into a virtual environment; the final image copies
# that environment (no pip, no compiler, no build context left behind) and NVIDIA's nvidia-cdi-hook. NVML,
# nvidia-smi and nvidia-cuda-mps-control are not in the image: they come from the node's driver root, mounted at
# /driver-root. CDI specs are written by the driver itself, so no nvidia-ctk either.
#
# PYTHON_IMAGE: any Debian bookworm image with Python 3.11 as python3 and its venv module. The default is the
# Python project's slim image; scripts/build-image passes one it built from Debian's own packages with mmdebstrap.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY src ./src
# Trimmed to what dradriver runs (tests/test_dockerfile.py keeps src/ from needing what goes): the kubernetes
# client's asyncio copy (kubernetes/aio) and its typed API classes (kubernetes/client/api; our cluster adapter
# sends requests through ApiClient and reads raw JSON), together 90 MB of source, and aiohttp with its own
# dependencies, which serve only the asyncio copy. pip and setuptools go once the environment is complete, so
# nothing can fetch or build code in the image. Bytecode is compiled ahead for everything but the client's
# generated models, which it imports lazily (few ever load).
RUN python3 -m venv /opt/dradriver \
    && /opt/dradriver/bin/pip install --no-cache-dir --no-compile -c constraints.txt . \
    && rm -rf /opt/dradriver/lib/python3.11/site-packages/kubernetes/aio \
              /opt/dradriver/lib/python3.11/site-packages/kubernetes/client/api \
    && /opt/dradriver/bin/pip uninstall --no-cache-dir -y aiohttp aiohttp-retry aiosignal aiohappyeyeballs attrs \
       frozenlist multidict propcache yarl pip setuptools \
    && /opt/dradriver/bin/python -m compileall -q -j 0 -x 'kubernetes/client/models/' /opt/dradriver/lib

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="dradriver" \
      org.opencontainers.image.description="Kubernetes DRA kubelet plugin for NVIDIA GPUs" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="dradriver"
COPY --from=build /opt/dradriver /opt/dradriver
# Built by scripts/build-cdi-hook (NVIDIA container toolkit v1.20.2, links glibc only): CDI specs name it for the
# update-ldcache and create-symlinks hooks.
COPY build/nvidia-cdi-hook /usr/local/bin/nvidia-cdi-hook
RUN ln -s /opt/dradriver/bin/dradriver /usr/local/bin/dradriver \
    && /usr/local/bin/dradriver --version >/dev/null
ENV GRPC_VERBOSITY=ERROR \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
ENTRYPOINT ["dradriver"]
CMD ["run"]
