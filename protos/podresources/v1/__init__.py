"""Pod-resources API v1 (`v1.PodResourcesLister`); stubs generated from api.proto."""
