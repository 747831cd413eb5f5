"""Path to the cut-down Kubernetes protobuf messages (protos/k8s)."""
