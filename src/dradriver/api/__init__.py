"""Generated protobuf/gRPC code for the kubelet APIs (see api/proto and scripts/gen-proto)."""
