"""Generic kubelet-plugin layer: registration and DRA gRPC services, ResourceSlice publishing, cluster access.

Knows nothing about GPUs; a driver plugs in behind the handler interface."""
