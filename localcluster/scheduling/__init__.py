"""``scheduling.k8s.io/v1``: PriorityClasses as kube-apiserver validates and bootstraps them."""
