"""``scheduling.k8s.io/v1``: PriorityClasses as kube-apiserver validates and bootstraps them, and
its ``Priority`` admission plugin, which gives every new pod the priority of its class."""
