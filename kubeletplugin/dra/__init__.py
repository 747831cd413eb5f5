"""The kubelet-facing gRPC edge: the DRA node service in both API versions, and registration."""
