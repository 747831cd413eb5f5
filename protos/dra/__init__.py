"""Kubelet DRA node API (k8s.io/kubelet/pkg/apis/dra), one subpackage per version."""
