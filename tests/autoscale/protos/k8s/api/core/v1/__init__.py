"""k8s.io/api/core/v1: `Node` and the messages it uses; stubs generated from generated.proto."""
