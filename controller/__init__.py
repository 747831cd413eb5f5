"""The ``instaslice-controller`` daemon: allocation of ResourceClaims for MIG profiles.

Rooms, by job:

- ``allocation`` — the allocation loop: a gated pod's claims → the placement engine → written,
  checked allocations → the pod let go (``allocation.sync`` reads top-down);
- ``classic`` — shadow claims that stand for classic ``nvidia.com/mig-<profile>`` requests, and
  their release when the pod is done;
- ``webhook`` — the admission webhook (pod gate, claim finalizer), its process and certificates.

Beside them: ``app`` assembles informers, allocator, leader election and metrics; ``__main__``
wires a process around it (flags in ``settings``, ``metrics``, ``logs``). The operator tools live
in ``instaslice`` and the test emulator in ``localcluster``; neither is imported from here.
"""
