"""The cluster parts the local API server lacks, each doing what the real one does and no more:
the resourceclaim controller, a binding-only scheduler, one kubelet per emulated node (plugin
watcher, device manager, pod-resources, DRA prepare/unprepare) and minimal workload controllers.
``runner.LocalCluster`` puts them together in one process."""
