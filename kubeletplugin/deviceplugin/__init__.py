"""The classic-resource shim: ``nvidia.com/mig-<profile>`` requests served through the device-plugin API.

Users who keep ``resources.limits: {nvidia.com/mig-1g.5gb: 1}`` get a slice on demand with the same
placement authority and accounting as DRA claims: the controller stands for each such request with a
*shadow claim* placed on a node; on that node the kubelet asks this shim's device plugin, and
``Allocate`` creates the shadow claim's slices through the plugin's own prepare path.

Modules, in the order a request flows:

- ``resources`` — profile ↔ resource name ↔ socket mapping;
- ``advertise`` — how many devices each resource advertises, and why;
- ``server`` — the ``v1beta1.DevicePlugin`` service per resource, and registration;
- ``allocate`` — binds a container's request to a reservation and prepares its slices;
- ``shadow`` / ``bindings`` — shadow claims in the API server, and the shim's checkpoint fields;
- ``podresources`` / ``moves`` / ``reconcile`` — who really holds which slice (the kubelet's
  pod-resources API), claims moved to match, finished ones released;
- ``watcher`` — re-serve and re-register when the kubelet restarts;
- ``shim`` — ``Shim`` and ``ShimConfig``, what ``kubeletplugin.__main__`` starts.
"""

from kubeletplugin.deviceplugin.shim import Shim, ShimConfig

__all__ = ["Shim", "ShimConfig"]
