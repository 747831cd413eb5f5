"""Device plugin API v1beta1 (`v1beta1.Registration`, `v1beta1.DevicePlugin`): generated stubs."""
