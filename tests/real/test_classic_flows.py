"""The classic (``nvidia.com/mig-*``) scenarios of ``tests/e2e`` on real kubelets: the device
manager's real Allocate and pod-resources, the same scenario functions (one scenario, two stacks)."""

from __future__ import annotations

from tests.e2e.test_classic_flows import (
    test_a_deployment_scaled_from_one_to_five_to_zero,
    test_a_placement_freed_by_a_deleted_classic_pod_is_not_handed_out_before_its_slice_is_gone,
    test_a_statefulset_pod_recreated_under_the_same_name_gets_a_fresh_slice,
    test_classic_pods_of_two_namespaces_started_together_each_use_their_own_slice,
    test_dra_and_classic_pods_share_a_node_and_each_sees_only_its_own_slices,
    test_one_pod_with_a_claim_and_a_classic_request_sees_both_slices,
    test_the_seed_test_pod_gets_a_slice_and_its_cdi_spec_and_deleting_it_removes_both,
)

__all__ = [
    "test_a_deployment_scaled_from_one_to_five_to_zero",
    "test_a_placement_freed_by_a_deleted_classic_pod_is_not_handed_out_before_its_slice_is_gone",
    "test_a_statefulset_pod_recreated_under_the_same_name_gets_a_fresh_slice",
    "test_classic_pods_of_two_namespaces_started_together_each_use_their_own_slice",
    "test_dra_and_classic_pods_share_a_node_and_each_sees_only_its_own_slices",
    "test_one_pod_with_a_claim_and_a_classic_request_sees_both_slices",
    "test_the_seed_test_pod_gets_a_slice_and_its_cdi_spec_and_deleting_it_removes_both",
]
