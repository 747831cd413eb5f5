"""Kubelet pod-resources API (k8s.io/kubelet/pkg/apis/podresources)."""
