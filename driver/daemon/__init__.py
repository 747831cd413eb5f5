"""The skeleton every daemon process shares: the flags all daemons have and env-backed flags with
bounded numbers (``settings``, ``flags``), the parser with ``--version`` and one-line refusals
(``parser``), start-up checks of paths (``paths``), the life of the process from logging set-up to
the last part stopped (``run``: ``signals``, ``logs``, the ``http`` server of ``/metrics`` and the
probes), a child that ends with its parent (``lifeline``) and a wakeable worker thread.

Each daemon keeps its own flags, metrics and probe logic in its package; only the mechanics live
here, so the controller and the kubelet plugin behave alike as processes.
"""
