"""The gRPC APIs only the test cloud provider speaks (cluster-autoscaler's externalgrpc, Kubernetes'
``Node``): their .proto files and generated stubs (``make protos``; README.md)."""
