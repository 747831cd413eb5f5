"""The soak: InstaSlice on the real Kubernetes stack for many minutes, under churn and faults.

``python -m localcluster.soak --minutes 20`` (``make soak``) runs the real control plane, three real
kubelets with our plugin, both controller replicas with their webhook processes, and

* ``churn``: a steady stream of DRA and classic pods of mixed profiles — Deployments scaled up and
  down, Jobs, single pods with lifetimes, claims of two slices;
* ``faults``: a seeded schedule of faults of every kind, each logged with its target and how long
  the system took to be whole again (``stack`` holds the primitives);
* ``checks``: the invariants, checked every few seconds and reported with the time they broke, and
  once more after the churn quiesced (``ledger`` remembers every pod of the churn);
* ``resources``: RSS, open descriptors and threads of every daemon every 10 s, and their growth.

``run`` puts them together and writes the report (``report``): ``report.txt`` and
``report.json`` in the output directory, with the timeline and the daemons' logs beside them.
"""
