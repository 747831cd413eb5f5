"""k8s.io/apimachinery/pkg/apis/meta/v1: `ObjectMeta`, `Time` and what they use; stubs generated from generated.proto."""
