"""dradriver: a Kubernetes DRA kubelet driver for NVIDIA GPUs."""

__version__ = "0.1.0"

DEFAULT_DRIVER_NAME = "gpu.dradriver.dev"
