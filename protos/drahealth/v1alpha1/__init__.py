"""DRA health API v1alpha1 (`v1alpha1.DRAResourceHealth`); stubs generated from api.proto."""
