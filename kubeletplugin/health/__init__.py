"""Health: the plugin's own liveness, and the GPUs' (XID errors, reported to the kubelet).

- ``liveness`` — ``/healthz``: both plugin sockets really answer;
- ``settings`` — which XIDs make a GPU unhealthy, and the taint effect;
- ``xid`` — the thread that waits for XID events;
- ``stream`` — the kubelet's ``DRAResourceHealth`` service.
"""
