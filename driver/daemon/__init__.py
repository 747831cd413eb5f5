"""Process plumbing both daemons share: env-backed flags, logging setup, the stop-on-signal event,
the plain-HTTP ``/metrics`` and probe server, and a wakeable worker thread.

Each daemon keeps its own flags, metrics and probe logic in its package; only the mechanics live
here, so the controller and the kubelet plugin behave alike as processes.
"""
