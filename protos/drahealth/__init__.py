"""Kubelet DRA resource-health API (k8s.io/kubelet/pkg/apis/dra-health)."""
