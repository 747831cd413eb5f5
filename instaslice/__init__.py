"""The ``instaslice`` command: operator tools for any cluster running InstaSlice.

- ``cli`` — the command (``status``, ``simulate``, ``defrag``, ``demo``);
- ``status`` — the cluster's slice map from the API objects alone;
- ``plancli`` / ``simplot`` / ``clusterplan`` — capacity planning and defragmentation: flags,
  output, plots, and a live cluster's occupancy as the planner needs it;
- ``planning`` — the planning code itself: traces, replay, floor, headroom, defragmentation plans.

Neither daemon imports this package, and this package imports nothing of the lab
(``localcluster``, ``bench``, ``tests``), which imports it: ``demo`` starts the checkout's
``python -m localcluster.demo`` by name (not shipped).
"""
