"""Kubelet plugin registration API (`pluginregistration.Registration`); stubs from api.proto."""
