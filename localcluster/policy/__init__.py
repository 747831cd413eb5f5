"""``policy/v1``: PodDisruptionBudgets as kube-apiserver validates them, their status as
kube-controller-manager's disruption controller keeps it, and the ``pods/eviction`` subresource
that honours them."""
