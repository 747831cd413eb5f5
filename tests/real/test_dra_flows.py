"""The DRA scenarios of ``tests/e2e`` on real Kubernetes: the same functions, collected here so that
they take this tier's ``cluster`` (one scenario, two stacks)."""

from __future__ import annotations

from tests.e2e.test_dra_flows import (
    test_1g_2g_and_3g_slices_share_one_gpu,
    test_a_4g_and_a_3g_slice_fill_one_gpu,
    test_a_job_of_three_runs_to_completion_and_gives_its_slices_back,
    test_a_pod_held_by_another_gate_is_placed_only_after_that_gate_is_lifted,
    test_claims_of_our_classes_are_created_protected_and_still_go_away_unallocated,
    test_one_pod_gets_three_slices_on_one_gpu_and_sees_all_three,
    test_pods_of_one_profile_fill_the_cluster_and_one_more_runs_after_a_deletion,
    test_the_claims_opaque_config_reaches_the_container,
    test_the_controllers_metrics_count_the_pods_our_webhook_gated,
    test_the_node_a_pod_is_bound_to_was_nominated_while_it_was_gated,
    test_two_whole_gpu_pods_land_on_two_gpus,
)

__all__ = [
    "test_1g_2g_and_3g_slices_share_one_gpu",
    "test_a_4g_and_a_3g_slice_fill_one_gpu",
    "test_a_job_of_three_runs_to_completion_and_gives_its_slices_back",
    "test_a_pod_held_by_another_gate_is_placed_only_after_that_gate_is_lifted",
    "test_claims_of_our_classes_are_created_protected_and_still_go_away_unallocated",
    "test_one_pod_gets_three_slices_on_one_gpu_and_sees_all_three",
    "test_pods_of_one_profile_fill_the_cluster_and_one_more_runs_after_a_deletion",
    "test_the_claims_opaque_config_reaches_the_container",
    "test_the_controllers_metrics_count_the_pods_our_webhook_gated",
    "test_the_node_a_pod_is_bound_to_was_nominated_while_it_was_gated",
    "test_two_whole_gpu_pods_land_on_two_gpus",
]
