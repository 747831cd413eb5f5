"""Contract: resource.k8s.io/v1 rules — claim spec immutable, allocation set once, slice shape."""

from __future__ import annotations

import http.client
import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from localcluster.apiserver import LocalApiServer
from tests.localcluster.helpers import NS, allocation, claim, status_of

DRIVER = "mig.instaslice.dev"


@pytest.fixture
def resource_api(kube_client: Any) -> Any:
    return client.ResourceV1Api(kube_client)


def _set_allocation(api: Any, name: str, value: Any) -> Any:
    return api.patch_namespaced_resource_claim_status(name, NS, {"status": {"allocation": value}})


def _invalid_message(caught: pytest.ExceptionInfo[ApiException]) -> str:
    assert caught.value.status == 422
    status = status_of(caught.value)
    assert status["reason"] == "Invalid"
    return str(status["message"])


def test_claim_spec_is_immutable(resource_api: Any) -> None:
    resource_api.create_namespaced_resource_claim(NS, claim("c"))
    changed = {
        "spec": {"devices": {"requests": [{"name": "other", "exactly": {"deviceClassName": "x"}}]}}
    }

    with pytest.raises(ApiException) as caught:
        resource_api.patch_namespaced_resource_claim("c", NS, changed)

    assert "spec: Invalid value" in _invalid_message(caught)
    assert "field is immutable" in _invalid_message(caught)


def test_claim_status_is_dropped_on_create(resource_api: Any) -> None:
    body = claim("c") | {"status": {"allocation": allocation("gpu-0-1g-5gb-0")}}

    created = resource_api.create_namespaced_resource_claim(NS, body)

    assert created.status is None or created.status.allocation is None


def test_allocation_through_main_resource_is_ignored(resource_api: Any) -> None:
    resource_api.create_namespaced_resource_claim(NS, claim("c"))

    patched = resource_api.patch_namespaced_resource_claim(
        "c", NS, {"status": {"allocation": allocation("gpu-0-1g-5gb-0")}}
    )

    assert patched.status is None or patched.status.allocation is None


def test_allocation_is_set_once(resource_api: Any) -> None:
    resource_api.create_namespaced_resource_claim(NS, claim("c"))

    allocated = _set_allocation(resource_api, "c", allocation("gpu-0-1g-5gb-0"))

    assert allocated.status.allocation.devices.results[0].device == "gpu-0-1g-5gb-0"


def test_allocation_cannot_be_replaced(resource_api: Any) -> None:
    resource_api.create_namespaced_resource_claim(NS, claim("c"))
    _set_allocation(resource_api, "c", allocation("gpu-0-1g-5gb-0"))

    with pytest.raises(ApiException) as caught:
        _set_allocation(resource_api, "c", allocation("gpu-0-1g-5gb-1"))

    message = _invalid_message(caught)
    assert "status.allocation" in message
    assert "field is immutable" in message


def test_allocation_can_be_cleared_then_set_again(resource_api: Any) -> None:
    resource_api.create_namespaced_resource_claim(NS, claim("c"))
    _set_allocation(resource_api, "c", allocation("gpu-0-1g-5gb-0"))

    cleared = _set_allocation(resource_api, "c", None)
    again = _set_allocation(resource_api, "c", allocation("gpu-0-1g-5gb-1"))

    assert cleared.status is None or cleared.status.allocation is None
    assert again.status.allocation.devices.results[0].device == "gpu-0-1g-5gb-1"


def test_reserved_for_needs_an_allocation(resource_api: Any) -> None:
    resource_api.create_namespaced_resource_claim(NS, claim("c"))
    consumer = {"resource": "pods", "name": "p", "uid": "1234"}

    with pytest.raises(ApiException) as caught:
        resource_api.patch_namespaced_resource_claim_status(
            "c", NS, {"status": {"reservedFor": [consumer]}}
        )

    assert "status.reservedFor" in _invalid_message(caught)


def test_allocation_result_must_name_a_request(resource_api: Any) -> None:
    resource_api.create_namespaced_resource_claim(NS, claim("c"))
    wrong = allocation("gpu-0-1g-5gb-0")
    wrong["devices"]["results"][0]["request"] = "nope"

    with pytest.raises(ApiException) as caught:
        _set_allocation(resource_api, "c", wrong)

    assert "results[0].request" in _invalid_message(caught)


def test_claim_request_needs_exactly_or_first_available(resource_api: Any) -> None:
    body = claim("c")
    del body["spec"]["devices"]["requests"][0]["exactly"]

    with pytest.raises(ApiException) as caught:
        resource_api.create_namespaced_resource_claim(NS, body)

    assert "spec.devices.requests[0]" in _invalid_message(caught)


def test_template_spec_is_immutable(resource_api: Any) -> None:
    template = {
        "metadata": {"name": "t"},
        "spec": {"spec": claim()["spec"]},
    }
    resource_api.create_namespaced_resource_claim_template(NS, template)

    with pytest.raises(ApiException) as caught:
        resource_api.patch_namespaced_resource_claim_template(
            "t", NS, {"spec": {"metadata": {"labels": {"a": "b"}}}}
        )

    assert "field is immutable" in _invalid_message(caught)


def _slice(name: str, node: str = "node-1", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 2},
            **spec,
        },
    }


def _devices(count: int, *, counters: bool) -> list[dict[str, Any]]:
    devices = []
    for i in range(count):
        device: dict[str, Any] = {"name": f"d{i}", "attributes": {"profile": {"string": "1g.5gb"}}}
        if counters:
            device["consumesCounters"] = [
                {"counterSet": "gpu-0", "counters": {"memory-slice-0": {"value": "1"}}}
            ]
        devices.append(device)
    return devices


COUNTERS = [{"name": "gpu-0", "counters": {"memory-slice-0": {"value": "1"}}}]


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"devices": _devices(1, counters=False), "sharedCounters": COUNTERS}, "only one of"),
        ({"devices": _devices(65, counters=True)}, "must have at most 64 items"),
        ({"devices": _devices(129, counters=False)}, "must have at most 128 items"),
        ({"devices": [{"name": "Bad_Name"}]}, "spec.devices[0].name"),
    ],
    ids=["devices-and-counters", "65-with-counters", "129-plain", "bad-device-name"],
)
def test_invalid_slices(resource_api: Any, spec: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ApiException) as caught:
        resource_api.create_resource_slice(_slice("s", **spec))

    assert fragment in _invalid_message(caught)


@pytest.mark.parametrize(
    "spec",
    [
        {"sharedCounters": COUNTERS},
        {"devices": _devices(64, counters=True)},
        {"devices": _devices(128, counters=False)},
    ],
    ids=["counters-only", "64-with-counters", "128-plain"],
)
def test_valid_slices(resource_api: Any, spec: dict[str, Any]) -> None:
    created = resource_api.create_resource_slice(_slice("s", **spec))

    assert created.metadata.name == "s"


def test_slice_node_name_is_immutable(resource_api: Any) -> None:
    resource_api.create_resource_slice(_slice("s", sharedCounters=COUNTERS))

    with pytest.raises(ApiException) as caught:
        resource_api.patch_resource_slice("s", {"spec": {"nodeName": "node-2"}})

    assert "spec.nodeName" in _invalid_message(caught)


@pytest.mark.parametrize(
    ("field_selector", "expected"),
    [
        ("spec.nodeName=node-2", ["b"]),
        (f"spec.driver={DRIVER}", ["a", "b"]),
        ("spec.driver=other.example.com", []),
    ],
    ids=["node", "driver", "other-driver"],
)
def test_slice_field_selectors(resource_api: Any, field_selector: str, expected: list[str]) -> None:
    resource_api.create_resource_slice(_slice("a", "node-1", sharedCounters=COUNTERS))
    resource_api.create_resource_slice(_slice("b", "node-2", sharedCounters=COUNTERS))

    listed = resource_api.list_resource_slice(field_selector=field_selector)

    assert [s.metadata.name for s in listed.items] == expected


def _request(**exactly: Any) -> dict[str, Any]:
    return {"name": "gpu", "exactly": {"deviceClassName": "mig.instaslice.dev", **exactly}}


@pytest.mark.parametrize(
    ("request_body", "fragment"),
    [
        (
            _request(selectors=[{"cel": {"expression": 'device.attributes["x" ==  '}}]),
            "spec.devices.requests[0].exactly.selectors[0].cel.expression: Invalid value",
        ),
        (_request(count=-1), "spec.devices.requests[0].exactly.count: Invalid value"),
        (
            {
                "name": "gpu",
                "firstAvailable": [
                    {
                        "name": "small",
                        "deviceClassName": "mig.instaslice.dev",
                        "selectors": [{"cel": {"expression": "device.driver =="}}],
                    }
                ],
            },
            "spec.devices.requests[0].firstAvailable[0].selectors[0].cel.expression",
        ),
    ],
    ids=["selector-does-not-compile", "count-negative", "subrequest-selector-does-not-compile"],
)
def test_a_claim_kube_apiserver_would_refuse_is_refused(
    resource_api: Any, request_body: dict[str, Any], fragment: str
) -> None:
    """Found on a real 1.36 API server: CEL selectors are compiled on create (a malformed one
    never reaches an allocator), and an exact count must be positive."""
    body = claim("c")
    body["spec"]["devices"]["requests"] = [request_body]
    with pytest.raises(ApiException) as caught:
        resource_api.create_namespaced_resource_claim(NS, body)
    assert fragment in _invalid_message(caught)


def test_a_device_class_with_a_malformed_selector_is_refused(resource_api: Any) -> None:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "broken"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver =="}}]},
    }
    with pytest.raises(ApiException) as caught:
        resource_api.create_device_class(body)
    assert "spec.selectors[0].cel.expression: Invalid value" in _invalid_message(caught)


def test_a_zero_count_is_defaulted_to_one(resource_api: Any) -> None:
    """As the real 1.36 API server does (0 is the field's zero value)."""
    body = claim("c")
    body["spec"]["devices"]["requests"] = [_request(count=0)]
    created = resource_api.create_namespaced_resource_claim(NS, body)
    assert created.spec.devices.requests[0].exactly.count == 1


# -- device taints and request tolerations (DRADeviceTaints, kube-apiserver's rules) -------------


def _post(server: LocalApiServer, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    """A raw POST (the typed client refuses some invalid bodies before sending them)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims"


def _refused(server: LocalApiServer, path: str, body: dict[str, Any]) -> str:
    code, status = _post(server, path, body)
    assert (code, status["reason"]) == (422, "Invalid")
    return str(status["message"])


def _tainted(*taints: dict[str, Any]) -> dict[str, Any]:
    device = _devices(1, counters=True)[0]
    device["taints"] = list(taints)
    return _slice("s", devices=[device])


UNHEALTHY = "mig.instaslice.dev/unhealthy"


@pytest.mark.parametrize(
    ("taints", "fragment"),
    [
        ([{"key": UNHEALTHY, "value": "Xid79"}], "spec.devices[0].taints[0].effect: Required"),
        ([{"key": UNHEALTHY, "effect": "Evict"}], 'supported values: "NoExecute", "NoSchedule"'),
        ([{"value": "Xid79", "effect": "NoSchedule"}], "spec.devices[0].taints[0].key: Required"),
        ([{"key": "not a key", "effect": "NoSchedule"}], "spec.devices[0].taints[0].key"),
        ([{"key": UNHEALTHY, "value": "XID 79!", "effect": "NoSchedule"}], "taints[0].value"),
        ([{"key": UNHEALTHY, "value": "x" * 64, "effect": "NoSchedule"}], "taints[0].value"),
        ([{"key": f"{UNHEALTHY}{i}", "effect": "NoSchedule"} for i in range(17)],
         "must have at most 16 items"),
        ([{"key": UNHEALTHY, "effect": "NoSchedule", "timeAdded": "yesterday"}], "timeAdded"),
    ],
    ids=["no-effect", "bad-effect", "no-key", "bad-key", "bad-value", "long-value", "17-taints",
         "bad-time"],
)  # fmt: skip
def test_invalid_device_taints(
    apiserver: LocalApiServer, taints: list[dict[str, Any]], fragment: str
) -> None:
    assert fragment in _refused(apiserver, SLICES, _tainted(*taints))


def test_device_taints_are_kept_and_get_their_time_added(resource_api: Any) -> None:
    given = {"key": UNHEALTHY, "value": "Xid79", "effect": "NoExecute",
             "timeAdded": "2026-12-01T17:00:00Z"}  # fmt: skip
    created = resource_api.create_resource_slice(
        _tainted(given, {"key": UNHEALTHY, "effect": "None"})
    )

    kept, defaulted = created.spec.devices[0].taints
    assert (kept.key, kept.value, kept.effect) == (UNHEALTHY, "Xid79", "NoExecute")
    assert kept.time_added.isoformat() == "2026-12-01T17:00:00+00:00"
    assert defaulted.effect == "None"
    assert defaulted.time_added is not None  # set by the API server, as kube-apiserver does


def test_more_than_64_devices_with_taints_are_refused(apiserver: LocalApiServer) -> None:
    devices = _devices(65, counters=False)
    devices[0]["taints"] = [{"key": UNHEALTHY, "effect": "NoSchedule"}]
    message = _refused(apiserver, SLICES, _slice("s", devices=devices))
    assert "must have at most 64 items" in message


def _claim_with(tolerations: list[dict[str, Any]]) -> dict[str, Any]:
    body = claim("c")
    body["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = tolerations
    return body


@pytest.mark.parametrize(
    ("tolerations", "fragment"),
    [
        ([{"key": UNHEALTHY, "operator": "Exists", "value": "Xid79"}], "must be empty"),
        ([{"key": UNHEALTHY, "operator": "Lt", "value": "1"}], "tolerations[0].operator"),
        ([{"key": UNHEALTHY, "operator": "Exists", "effect": "Never"}], "tolerations[0].effect"),
        ([{"key": "bad key", "operator": "Exists"}], "tolerations[0].key"),
        ([{"operator": "Exists"}] * 17, "must have at most 16 items"),
    ],
    ids=["exists-with-value", "bad-operator", "bad-effect", "bad-key", "17-tolerations"],
)
def test_invalid_tolerations(
    apiserver: LocalApiServer, tolerations: list[dict[str, Any]], fragment: str
) -> None:
    assert fragment in _refused(apiserver, CLAIMS, _claim_with(tolerations))


def test_a_toleration_without_operator_is_equal(resource_api: Any) -> None:
    created = resource_api.create_namespaced_resource_claim(
        NS, _claim_with([{"key": UNHEALTHY, "value": "Xid79", "effect": "NoSchedule"}])
    )

    (toleration,) = created.spec.devices.requests[0].exactly.tolerations
    assert (toleration.key, toleration.operator, toleration.value) == (UNHEALTHY, "Equal", "Xid79")
