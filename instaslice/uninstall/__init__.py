"""``instaslice uninstall``: InstaSlice removed without a pod left Terminating or a slice left behind.

``survey`` (who holds slices) and ``manifests`` (what to delete, in which order) are pure;
``run`` does it through the ``ClusterApi`` port.
"""
