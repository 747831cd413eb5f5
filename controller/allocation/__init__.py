"""The allocation loop: a gated pod, placed first-fit over the published slices, written, let go.

In the order a pod meets them:

- ``allocator`` — informer events in, pod keys on a work queue, worker threads;
- ``sync`` — one pod, one pass: its claims, the engine's answer, the writes, the ungating;
- ``podclaims`` — which claims a pod needs and which of them are ours;
- ``requests`` / ``candidates`` / ``selectors`` / ``cel_library`` — a claim's requests as engine
  requests over the devices their DeviceClass and CEL selectors accept;
- ``inventory`` / ``occupancy`` / ``state`` — what the nodes publish, what is taken, and the
  lock-guarded engine the workers decide on;
- ``nodefilter`` — the cheap checks kube-scheduler would make of a node;
- ``results`` / ``writes`` / ``outcome`` — the engine's answer as ``status.allocation``, written
  and checked before the pod is let go;
- ``conditions`` — why a pod waits, as a pod condition and an event;
- ``handoff`` — pods handed to kube-scheduler instead.
"""
