"""Prepare and unprepare, durably: what this node created for which claim, and recovery.

- ``devicestate`` — prepare / unprepare of one claim, idempotent (what the DRA service calls);
- ``claims`` / ``claim_devices`` — a claim's allocation → the slices to create → the devices answered;
- ``overlaps`` — prepared slices in the way of a new prepare;
- ``slices`` — MIG instances as the checkpoint sees them, created and destroyed per GPU;
- ``journal`` — the checkpoint, saved durably;
- ``recovery`` — checkpoint ⇄ GPU ⇄ API server reconciled at start;
- ``devicestatus`` — each prepared device's MIG UUID in its claim's status.
"""
