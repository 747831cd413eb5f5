"""k8s.io/apimachinery/pkg/api/resource: `Quantity`; stubs generated from generated.proto."""
