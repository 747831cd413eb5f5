"""DRA node API v1 (`k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`); stubs generated from api.proto."""
