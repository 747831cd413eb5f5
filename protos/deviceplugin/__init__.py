"""Kubelet device plugin API (k8s.io/kubelet/pkg/apis/deviceplugin)."""
