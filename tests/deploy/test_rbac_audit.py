"""RBAC against what the components really do: a grant nothing calls is too much.

One recorded run: the real ``instaslice-controller`` and ``instaslice-kubelet-plugin`` processes of
an ``InstaSliceStack`` (one node, one emulated A100) against a local API server with an audit log.
It exercises leader election, the plugin's slice publishing and pool repair, a DRA pod, a DRA pod
whose claim was admitted while the claim webhook was down (the controller adds the finalizer), a classic
pod that finishes (shadow claim released), a pod that must wait (condition and event), deletion
and teardown, and the self-managed webhook certificate (Secret and ``caBundle``). Each request
is attributed to a component by its user agent (``ClientSettings.user_agent``), then:

* every request a component made is allowed by its ServiceAccount's RBAC in the rendered
  ``deploy/overlays/emulated`` (a missing grant fails, naming the verb and resource);
* every grant is used by the run, or listed in ``UNUSED_BUT_NEEDED`` with the reason the run cannot
  reach it (a grant nobody uses fails).
"""

from __future__ import annotations

import base64
import copy
import time
from collections.abc import Callable

import pytest

from api import names
from api.names import PLACEMENT_CONDITION
from controller.webhook.certificates import (
    CA_FILE,
    MUTATING_WEBHOOK_CONFIGURATIONS,
    SECRETS,
    CertificateSettings,
)
from driver.cluster.port import (
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    JsonObject,
    PatchType,
    name_of,
)
from driver.errors import ApiNotFoundError, DriverError
from localcluster.apiserver import LocalApiServer
from localcluster.audit import AuditLog, AuditRecord, group_by_user_agent
from localcluster.cluster.kubelet import RUN_SECONDS_ANNOTATION
from localcluster.cluster.runner import LocalCluster
from localcluster.manifests import apply_object
from localcluster.processes import ManagedProcess
from localcluster.stack import InstaSliceStack, StackConfig, free_port
from tests.deploy.rbac import Grant, Request, shipped

# --- the recorded run: the real daemons against the audited local API server ------------------

NAMESPACE = "rbac-audit"
NODE = "node-0"
PROFILE = "1g.5gb"
COMPONENTS = ("instaslice-controller", "instaslice-kubelet-plugin")
"""User-agent product → the ServiceAccount the component runs as (same names)."""
HARNESS_AGENTS = ("localcluster", "kube-controller-manager", "kube-scheduler", "kubelet")
"""The emulated cluster's own clients: not ours to check."""
WAIT_S = 30.0


def _pod(
    name: str,
    *,
    limits: dict[str, str] | None = None,
    template: str | None = None,
    run_seconds: float | None = None,
) -> JsonObject:
    container: JsonObject = {
        "name": "app",
        "image": "busybox:1.36",
        "resources": {"requests": {"cpu": "10m"}, "limits": {"memory": "64Mi", **(limits or {})}},
    }
    spec: JsonObject = {"restartPolicy": "Never", "containers": [container]}
    if template is not None:
        spec["resourceClaims"] = [{"name": "mig", "resourceClaimTemplateName": template}]
        container["resources"]["claims"] = [{"name": "mig"}]
    metadata: JsonObject = {"name": name, "namespace": NAMESPACE}
    if run_seconds is not None:
        metadata["annotations"] = {RUN_SECONDS_ANNOTATION: str(run_seconds)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _claim_template(name: str) -> JsonObject:
    request = {"name": "mig", "exactly": {"deviceClassName": names.profile_device_class(PROFILE)}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def _phase(stack: InstaSliceStack, name: str) -> str:
    try:
        pod = stack.api.get(PODS, name=name, namespace=NAMESPACE)
    except ApiNotFoundError:
        return ""
    return str((pod.get("status") or {}).get("phase") or "")


def _wait_phase(stack: InstaSliceStack, name: str, phase: str) -> None:
    stack.wait_for(
        lambda: _phase(stack, name) == phase, timeout=WAIT_S, message=f"pod {name} is not {phase}"
    )


def _placement_condition(stack: InstaSliceStack, name: str) -> JsonObject | None:
    pod = stack.api.get(PODS, name=name, namespace=NAMESPACE)
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == PLACEMENT_CONDITION:
            return dict(condition)
    return None


def _allocated_claims(stack: InstaSliceStack) -> list[JsonObject]:
    claims = stack.api.list_objects(RESOURCE_CLAIMS, namespace=NAMESPACE).items
    return [c for c in claims if (c.get("status") or {}).get("allocation")]


def _node_slices(stack: InstaSliceStack) -> list[JsonObject]:
    return stack.api.list_objects(RESOURCE_SLICES, field_selector=f"spec.nodeName={NODE}").items


def _repair_the_pool(stack: InstaSliceStack) -> None:
    """A stale slice in the plugin's pool (an older plugin's layout): the plugin deletes it and
    republishes the pool with a new generation (create, update, delete of ResourceSlices)."""
    existing = _node_slices(stack)
    stale = copy.deepcopy(next(s for s in existing if s["spec"].get("devices")))
    stale["metadata"] = {
        "name": f"{NODE}-stale",
        "ownerReferences": stale["metadata"].get("ownerReferences") or [],
    }
    stack.api.create(RESOURCE_SLICES, stale)
    generation = max(int(s["spec"]["pool"]["generation"]) for s in existing)

    def repaired() -> bool:
        slices = _node_slices(stack)
        return all(
            name_of(s) != name_of(stale) and int(s["spec"]["pool"]["generation"]) > generation
            for s in slices
        ) and bool(slices)

    stack.wait_for(repaired, timeout=WAIT_S, message="the plugin did not repair its pool")


def _exercise(stack: InstaSliceStack) -> None:
    api = stack.api
    stack.wait_ready(classic=True)
    apply_object(api, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    _repair_the_pool(stack)

    # A DRA pod, a classic pod that finishes (its shadow claim is released by the controller and
    # its slice destroyed by the shim), and a pod that waits for a whole GPU the others hold
    # (condition and event).
    apply_object(api, _claim_template("mig"))
    apply_object(api, _pod("dra", template="mig"))
    classic = {names.classic_resource_name(PROFILE): "1"}
    apply_object(api, _pod("classic", limits=classic, run_seconds=0.5))
    _wait_phase(stack, "dra", "Running")
    _claim_admitted_while_its_webhook_is_down(stack)
    apply_object(api, _pod("waits", limits={names.classic_resource_name("7g.40gb"): "1"}))
    _wait_phase(stack, "classic", "Succeeded")
    stack.wait_for(
        lambda: (_placement_condition(stack, "waits") or {}).get("status") == "False",
        timeout=WAIT_S,
        message="the waiting pod got no Placement=False condition",
    )
    stack.wait_for(
        lambda: len(_allocated_claims(stack)) == 2,  # the two DRA pods' claims
        timeout=WAIT_S,
        message="the finished classic pod's shadow claim was not released",
    )
    for name in ("dra", "unprotected", "classic", "waits"):
        api.delete(PODS, name=name, namespace=NAMESPACE)
    stack.wait_for(
        lambda: not api.list_objects(RESOURCE_CLAIMS, namespace=NAMESPACE).items,
        timeout=WAIT_S,
        message="claims left after the pods were deleted",
    )
    stack.wait_for(
        lambda: not stack.mig_instances(NODE) or None,
        timeout=WAIT_S,
        message="MIG instances left on the node",
    )


CLAIM_WEBHOOK = "claim-finalizer.instaslice.dev"


def _claim_admitted_while_its_webhook_is_down(stack: InstaSliceStack) -> None:
    """The claim webhook fails open: a claim created while it cannot be reached lacks the
    delete-protection finalizer, and the controller adds it before writing the allocation
    (resourceclaims update). Its endpoint is pointed at a closed port for one pod's claim; the
    controller's write is what ``test_every_grant_is_used_or_explained`` then finds."""
    api = stack.api
    config = api.get(MUTATING_WEBHOOK_CONFIGURATIONS, name=WEBHOOK_CONFIGURATION)
    working = copy.deepcopy(config["webhooks"])
    for hook in config["webhooks"]:
        if hook["name"] == CLAIM_WEBHOOK:
            hook["clientConfig"]["url"] = f"https://127.0.0.1:{free_port()}/unreachable"
    api.update(MUTATING_WEBHOOK_CONFIGURATIONS, config)
    try:
        apply_object(api, _pod("unprotected", template="mig"))
        stack.wait_for(
            lambda: _claim_of(stack, "unprotected") is not None,
            timeout=WAIT_S,
            message="the pod's claim was not created",
        )
    finally:
        restored = api.get(MUTATING_WEBHOOK_CONFIGURATIONS, name=WEBHOOK_CONFIGURATION)
        restored["webhooks"] = working
        api.update(MUTATING_WEBHOOK_CONFIGURATIONS, restored)
    _wait_phase(stack, "unprotected", "Running")
    claim = _claim_of(stack, "unprotected")
    assert claim is not None
    assert names.DELETE_PROTECTION_FINALIZER in (claim["metadata"].get("finalizers") or [])


def _claim_of(stack: InstaSliceStack, pod: str) -> JsonObject | None:
    """The claim generated for ``pod`` from its template (None until it exists)."""
    for claim in stack.api.list_objects(RESOURCE_CLAIMS, namespace=NAMESPACE).items:
        owners = claim["metadata"].get("ownerReferences") or []
        if any(o.get("kind") == "Pod" and o.get("name") == pod for o in owners):
            return claim
    return None


def _classic_shim_off(stack: InstaSliceStack) -> None:
    """The plugin restarted with --classic-shim off (scheduler mode): it watches its Node and removes
    the nvidia.com/mig-* entries the kubelet keeps (and writes back once the shim's device plugins
    are gone) from the Node's status (nodes list/watch, nodes/status patch)."""
    stack.restart_plugin(NODE, kill=False, classic_shim=False)

    def stale() -> list[str]:
        status = stack.api.get(NODES, name=NODE).get("status") or {}
        return [
            name
            for field in ("capacity", "allocatable")
            for name in status.get(field) or {}
            if name.startswith(names.CLASSIC_RESOURCE_PREFIX)
        ]

    stack.wait_for(lambda: not stale() or None, timeout=WAIT_S, message="stale classic resources")


SELF_IDENTITY = "rbac-audit-self-managed"
WEBHOOK_SECRET = CertificateSettings(service="", namespace="").secret_name
WEBHOOK_CONFIGURATION = "instaslice-pod-gate"
DAMAGED = base64.b64encode(b"not a certificate").decode()


def _self_managed_certificates(stack: InstaSliceStack) -> None:
    """The Deployment's default ``--cert-mode self``, which the stack (``--cert-mode files``) does
    not run: the stack's controller is stopped (its lease released), and a controller in self mode
    takes over. It creates the webhook Secret and sets the configuration's ``caBundle``; restarted
    after the Secret was damaged, it repairs it (Secret get/create/update, webhook configuration
    get/update, lease takeover). No pod is created afterwards: the stack's webhook URL is
    ``127.0.0.1``, which a self-managed certificate (Service names) does not cover."""
    assert stack.controller is not None
    stack.controller.stop()
    process = ManagedProcess(
        name="controller (cert-mode self)",
        module="controller",
        args=[
            "--kube-api-url", stack.url,
            "--webhook-port", str(free_port()),
            "--webhook-cert-dir", str(stack.root / "controller" / "self-managed-certs"),
            "--cert-mode", "self",
            "--identity", SELF_IDENTITY,
            "--metrics-address", "",
            "--healthz-address", "",
            "--leader-elect",
            "--lease-duration", "4",
            "--renew-deadline", "2",
            "--retry-period", "0.5",
        ],
        log_file=stack.logs_dir / "controller-self-managed.log",
    )  # fmt: skip

    def secret_ca() -> str:
        try:
            secret = stack.api.get(SECRETS, name=WEBHOOK_SECRET, namespace=names.SYSTEM_NAMESPACE)
        except ApiNotFoundError:
            return ""
        return str((secret.get("data") or {}).get(CA_FILE) or "")

    def in_force() -> bool:
        config = stack.api.get(MUTATING_WEBHOOK_CONFIGURATIONS, name=WEBHOOK_CONFIGURATION)
        bundles = {h["clientConfig"].get("caBundle") for h in config["webhooks"]}
        ca = secret_ca()
        return bool(ca) and ca != DAMAGED and bundles == {ca} and stack.leader() == SELF_IDENTITY

    try:
        process.start()
        _wait_alive(process, in_force, message="self-managed certificate not in force")
        process.stop()
        stack.api.patch(
            SECRETS,
            name=WEBHOOK_SECRET,
            namespace=names.SYSTEM_NAMESPACE,
            patch={"data": {CA_FILE: DAMAGED}},
            patch_type=PatchType.MERGE,
        )
        process.start()
        _wait_alive(process, in_force, message="damaged webhook Secret not repaired")
    except (TimeoutError, RuntimeError) as exc:
        raise TimeoutError(f"{exc}\n--- {process.name}:\n{process.log_tail(40)}") from exc
    finally:
        process.stop()


def _wait_alive(process: ManagedProcess, predicate: Callable[[], bool], *, message: str) -> None:
    """Poll ``predicate`` while ``process`` runs (the stack's own wait fails on the controller
    stopped on purpose)."""
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if not process.running():
            raise RuntimeError(f"{process.name} exited with status {process.returncode()}")
        if time.monotonic() > deadline:
            raise TimeoutError(message)
        time.sleep(0.05)


@pytest.fixture(scope="module")
def recorded() -> dict[str, list[AuditRecord]]:
    """Every request of the run, grouped by user-agent product."""
    log = AuditLog()
    with LocalApiServer(graceful_pod_deletion=True, audit=log) as server:
        stack = InstaSliceStack(StackConfig(nodes=1, gpus="1xA100-40GB", inventory_poll_s=0.5))
        # The stack's cluster starts its own API server; attach it to the audited one instead.
        stack.cluster = LocalCluster(stack.cluster.nodes, stack.cluster.root, api_url=server.url)
        try:
            stack.start()
            _exercise(stack)
            _classic_shim_off(stack)
            _self_managed_certificates(stack)
        except (TimeoutError, RuntimeError, DriverError) as exc:
            pytest.fail(f"the recorded run failed: {exc}\n{_log_tails(stack)}")
        finally:
            stack.stop()
    assert log.dropped == 0
    return group_by_user_agent(log.records())


def _log_tails(stack: InstaSliceStack) -> str:
    processes = [*stack.plugins.values(), *([stack.controller] if stack.controller else [])]
    return "\n".join(f"--- {p.name}:\n{p.log_tail(40)}" for p in processes)


def test_every_request_comes_from_a_known_component(recorded: dict[str, list[AuditRecord]]) -> None:
    """Our daemons name themselves (``ClientSettings.user_agent``): an anonymous client's requests
    could not be checked against any ServiceAccount."""
    assert set(recorded) <= {*COMPONENTS, *HARNESS_AGENTS}, sorted(recorded)
    for component in COMPONENTS:
        assert recorded.get(component), f"no request recorded from {component}"


@pytest.mark.parametrize("component", COMPONENTS)
def test_every_request_is_allowed_by_the_components_rbac(
    recorded: dict[str, list[AuditRecord]], component: str
) -> None:
    authorizer = shipped(component)
    denied: set[str] = set()
    for record in recorded.get(component, []):
        attributes = record.attributes
        if not attributes.is_resource_request:
            if not authorizer.allows_non_resource(attributes.verb, attributes.path):
                denied.add(f"{attributes.verb} {attributes.path}")
            continue
        request = _request(record)
        for check in authorizer.denied(request):
            extra = "" if check == request else f" (also checked for {record.describe()})"
            denied.add(f"{check}{extra}" if extra else record.describe())
    assert not denied, f"{component} made requests its RBAC does not allow:\n" + "\n".join(
        sorted(denied)
    )


def _request(record: AuditRecord) -> Request:
    a = record.attributes
    return Request(a.verb, a.api_group, a.resource, a.subresource, a.namespace, a.name)


_SHIM_MOVE = (
    "kubeletplugin/deviceplugin/shadow.py move_claim: only when the kubelet gave a container the "
    "slices reserved for another pod of the same profile (two identical pods admitted at once); "
    "the emulated kubelet admits one pod at a time, so the shim's guess is always right here"
)
_NODE_EVENT = (
    "kubeletplugin/node/publisher.py: a warning on the Node for a GPU whose MIG mode is off; "
    "emulated GPUs always have MIG mode on"
)

UNUSED_BUT_NEEDED: dict[str, dict[tuple[str, str, str], str]] = {
    # component -> (apiGroup, resource, verb) -> why the recorded run does not need it
    "instaslice-controller": {
        ("", "pods/eviction", "create"): (
            "controller/allocation/sync.py: victims are evicted only when a higher-priority pod "
            "fits nowhere; tests/controller/test_priority.py exercises it"
        ),
        ("", "pods", "get"): (
            "controller/allocation/sync.py, driver/cluster/ops.py: a pod is read from the API, not the "
            "cache, only after a lost race (a failed JSON-patch test, a conflict, a withdrawal)"
        ),
        ("resource.k8s.io", "resourceclaims", "get"): (
            "controller/classic/shadow.py: a shadow claim that already exists (AlreadyExists on create, "
            "e.g. a new leader re-placing a pod) is read and adopted"
        ),
        ("", "events", "patch"): (
            "driver/cluster/events.py: the same event again on the same object is counted up on "
            "the posted one; the controller posts one per change of a pod's placement condition"
        ),
    },
    "instaslice-kubelet-plugin": {
        ("resource.k8s.io", "resourceclaims", "update"): _SHIM_MOVE,
        ("resource.k8s.io", "resourceclaims/driver", "associated-node:update"): (
            "kubeletplugin/state/devicestatus.py: the status.devices write (MIG UUIDs) is authorized "
            "there too on Kubernetes >= 1.36; the audit does not tell which status fields a write "
            "changed, so tests/deploy/rbac.py checks every status write against /binding only"
        ),
        ("resource.k8s.io", "resourceclaims/binding", "update"): _SHIM_MOVE,
        ("", "events", "create"): _NODE_EVENT,
        ("", "events", "patch"): _NODE_EVENT,
    },
}


@pytest.mark.parametrize("component", COMPONENTS)
def test_every_grant_is_used_or_explained(
    recorded: dict[str, list[AuditRecord]], component: str
) -> None:
    """The reverse: a grant the run never needed is either explained (a path the run cannot
    reach) or too much."""
    authorizer = shipped(component)
    used: set[Grant] = set()
    for record in recorded.get(component, []):
        if record.attributes.is_resource_request:
            used |= authorizer.used_by(_request(record))
    explained = UNUSED_BUT_NEEDED[component]
    unused = {(g.api_group, g.resource, g.verb) for g in authorizer.grants - used} - set(explained)
    assert not unused, (
        f"{component}: granted but never used (remove, or explain why):\n"
        + "\n".join(
            f"{verb} {group or 'core'}/{resource}" for group, resource, verb in sorted(unused)
        )
    )
    granted = {(g.api_group, g.resource, g.verb) for g in authorizer.grants}
    assert set(explained) <= granted, f"explained but not granted: {set(explained) - granted}"
