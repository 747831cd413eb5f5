"""The ``instaslice-kubelet-plugin`` daemon: MIG slices created and deleted on the node.

Rooms, by job:

- ``dra`` — the kubelet's DRA gRPC service (``NodePrepareResources`` / ``NodeUnprepareResources``)
  and plugin registration;
- ``state`` — prepare and unprepare: claims → MIG instances → CDI specs, the checkpoint, recovery
  after a restart, and the devices' status in their claims;
- ``node`` — what the plugin says about its node: the published ResourceSlices, node events, the
  classic capacity it cleans up, and MIG mode at start;
- ``health`` — liveness of the sockets, XID device health, the kubelet's health stream;
- ``deviceplugin`` — the classic-resource shim (``nvidia.com/mig-<profile>`` through the
  device-plugin API).

``plugin`` builds and starts the parts; ``__main__`` wires a process around it (flags in
``settings``). ``selfcheck`` is the operator's pre-deploy check (``instaslice-kubelet-plugin check``).
"""
