"""Figures read from the daemons' ``/metrics`` (Prometheus text, parsed by ``prometheus_client``)."""

from __future__ import annotations

from typing import Final

from prometheus_client.parser import text_string_to_metric_families

DAEMONS: Final = {
    "instaslice_controller": "controller",
    "instaslice_webhook": "webhook",
    "instaslice_kubelet_plugin": "plugin",
}


def _by_informer(text: str, suffix: str) -> dict[tuple[str, str], float]:
    found: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            prefix = sample.name.removesuffix(suffix)
            if prefix != sample.name and prefix in DAEMONS and "informer" in sample.labels:
                found[(DAEMONS[prefix], sample.labels["informer"])] = sample.value
    return found


def informer_objects(text: str) -> dict[tuple[str, str], float]:
    """(daemon, informer) → objects cached, from one scrape (a controller's includes its webhook
    process's figures)."""
    return _by_informer(text, "_informer_objects")


def informer_lists(text: str) -> dict[tuple[str, str], float]:
    """(daemon, informer) → full lists made since the process started."""
    return _by_informer(text, "_informer_lists_total")


def leading(text: str) -> bool | None:
    """Whether the controller that served ``text`` allocates as the leader; None without an
    answer (its ``/metrics`` did not respond)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "instaslice_controller_leader":
                return sample.value == 1
    return None
