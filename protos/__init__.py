"""Kubelet gRPC API definitions (.proto) and their generated Python stubs."""
