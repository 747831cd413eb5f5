"""The admission webhook: pods that will need MIG slices are gated, claims of ours protected.

- ``admission`` — the decision, pure: an AdmissionReview and a read-only context in, a response out;
- ``context`` — that context answered from informer caches;
- ``server`` — the HTTPS endpoint kube-apiserver calls;
- ``process`` / ``child`` — the webhook in a process of its own, and the controller's side of it;
- ``replica`` — one replica's serving certificate and server;
- ``certificates`` — the self-managed serving certificate and the configuration's ``caBundle``.
"""
