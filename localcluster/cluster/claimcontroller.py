"""kube-controller-manager's resourceclaim controller, as far as our flow meets it.

* A pod naming a ``resourceClaimTemplateName`` gets its claim while still gated: generated name
  ``<pod>-<claim>-<5 random>``, the pod as controller owner (``blockOwnerDeletion``), annotation
  ``resource.kubernetes.io/pod-claim-name``, recorded in ``pod.status.resourceClaimStatuses``.
* ``status.reservedFor`` loses pods that are gone or done (Succeeded/Failed, or deleted before being
  scheduled); when the last consumer goes, a claim carrying ``resource.kubernetes.io/delete-protection``
  has its allocation cleared and the finalizer removed — claims without it stay allocated (docs/design.md
  F3). A claim being deleted has the finalizer removed once unreserved.
* An unreserved generated claim whose owning pod is done is deleted.

Like the real one it only looks at a claim when the claim changes or a pod that *names* it in
``spec.resourceClaims`` changes: a classic pod's shadow claim is not revisited when that pod merely
finishes (docs/design.md F6) — releasing those is InstaSlice's job. Claims of deleted pods go through
the API server's garbage collector (ownerReferences), as in kube.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections import OrderedDict

from driver.cluster.indexes import BY_POD_UID, claim_pod_uids
from driver.cluster.informer import Informer
from driver.cluster.port import (
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    JsonObject,
    key_for,
    metadata,
    name_of,
    namespace_of,
    uid_of,
)
from driver.errors import AlreadyExistsError, ApiNotFoundError, ConflictError
from localcluster.cluster.client import ControlPlaneApi
from localcluster.cluster.loop import InformerFactory, KeyedLoop, ensure_index
from localcluster.cluster.podutil import (
    POD_CLAIM_NAME_ANNOTATION,
    ClaimNotCreatedError,
    is_deleting,
    is_owned_by,
    is_terminal,
    node_name,
    pod_claim_refs,
)

log = logging.getLogger(__name__)

DELETE_PROTECTION_FINALIZER = "resource.kubernetes.io/delete-protection"
_MAX_BASE_LEN = 57  # 63 minus "-" and 5 random characters
_DELETED_MEMORY = 10_000
_POD = "pod:"
_CLAIM = "claim:"
_STATUS_ATTEMPTS = 5


def generate_name_base(pod_name: str, pod_claim: str) -> str:
    """``<pod>-<claim>-``, both parts shortened in proportion when too long (as kube does)."""
    base = f"{pod_name}-{pod_claim}"
    if len(base) > _MAX_BASE_LEN:
        base = (
            pod_name[: len(pod_name) * _MAX_BASE_LEN // len(base)]
            + "-"
            + pod_claim[: len(pod_claim) * _MAX_BASE_LEN // len(base)]
        )
    return base + "-"


def is_pod_done(pod: JsonObject) -> bool:
    """None of its containers runs or ever will: terminal, or deleted before being scheduled."""
    return is_terminal(pod) or (is_deleting(pod) and not node_name(pod))


class ResourceClaimController:
    def __init__(self, *, api: ControlPlaneApi, informers: InformerFactory, workers: int = 2):
        self._api = api
        self._pods: Informer = informers.informer(PODS)
        self._claims: Informer = informers.informer(RESOURCE_CLAIMS)
        self._templates: Informer = informers.informer(RESOURCE_CLAIM_TEMPLATES)
        self._loop = KeyedLoop(name="resourceclaim-controller", sync=self._sync, workers=workers)
        self._lock = threading.Lock()
        self._deleted_pods: OrderedDict[str, None] = OrderedDict()
        # claims we created that the informer may not show yet (client-go's mutation cache)
        self._created: dict[str, JsonObject] = {}

    def start(self) -> None:
        ensure_index(self._claims, BY_POD_UID, claim_pod_uids)
        self._pods.add_handler(
            on_add=lambda p: self._on_pod(p, deleted=False),
            on_update=lambda _, p: self._on_pod(p, deleted=False),
            on_delete=lambda p: self._on_pod(p, deleted=True),
        )
        self._claims.add_handler(
            on_add=self._on_claim,
            on_update=lambda _, c: self._on_claim(c),
            on_delete=self._on_claim_deleted,
        )
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()

    # --- event handlers (enqueue only) ----------------------------------------------------------

    def _on_pod(self, pod: JsonObject, *, deleted: bool) -> None:
        if not (pod.get("spec") or {}).get("resourceClaims"):
            return
        if deleted:
            with self._lock:
                self._deleted_pods[uid_of(pod)] = None
                while len(self._deleted_pods) > _DELETED_MEMORY:
                    self._deleted_pods.popitem(last=False)
        namespace = namespace_of(pod)
        if deleted or is_pod_done(pod):
            try:
                refs = pod_claim_refs(pod)
            except ClaimNotCreatedError:
                refs = []
            for ref in refs:
                self._loop.add(_CLAIM + key_for(name=ref.claim_name, namespace=namespace))
        if not deleted and not is_deleting(pod):
            self._loop.add(_POD + key_for(name=name_of(pod), namespace=namespace))

    def _on_claim(self, claim: JsonObject) -> None:
        key = key_for(name=name_of(claim), namespace=namespace_of(claim))
        with self._lock:
            self._created.pop(key, None)
        self._loop.add(_CLAIM + key_for(name=name_of(claim), namespace=namespace_of(claim)))

    def _on_claim_deleted(self, claim: JsonObject) -> None:
        # A generated claim deleted by someone while its pod still needs it is created again.
        for owner in metadata(claim).get("ownerReferences") or []:
            if owner.get("kind") == "Pod" and owner.get("controller"):
                key = key_for(name=str(owner.get("name")), namespace=namespace_of(claim))
                self._loop.add(_POD + key)

    # --- reconcile ------------------------------------------------------------------------------

    def _sync(self, key: str) -> None:
        if key.startswith(_POD):
            self._sync_pod(key[len(_POD) :])
        else:
            self._sync_claim(key[len(_CLAIM) :])

    def _sync_pod(self, key: str) -> None:
        pod = self._pods.get_by_key(key)
        if pod is None or is_deleting(pod) or is_pod_done(pod):
            return
        statuses = {
            str(s.get("name")): s
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        }
        new: dict[str, str] = {}
        for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
            template = entry.get("resourceClaimTemplateName")
            pod_claim = str(entry.get("name") or "")
            if not template:
                continue
            recorded = statuses.get(pod_claim)
            if recorded is not None:
                name = recorded.get("resourceClaimName")
                if not name:
                    continue  # "not needed"
                existing = self._cached_claim(str(name), namespace_of(pod))
                if existing is not None and is_owned_by(existing, pod):
                    continue
                # deleted meanwhile, or taken over: kube creates a new one
                log.warning(
                    "claim %s of pod %s is gone or not owned by it; creating another", name, key
                )
            claim = self._find_generated(pod, pod_claim) or self._create(pod, pod_claim, template)
            new[pod_claim] = name_of(claim)
        if new:
            self._record_statuses(pod, new)

    def _cached_claim(self, name: str, namespace: str | None) -> JsonObject | None:
        claim = self._claims.get(name, namespace=namespace)
        if claim is None:
            with self._lock:
                claim = self._created.get(key_for(name=name, namespace=namespace))
        return claim

    def _find_generated(self, pod: JsonObject, pod_claim: str) -> JsonObject | None:
        """A claim already created for this pod claim whose name never reached the pod's status
        (kube's ``findPodResourceClaim``)."""
        with self._lock:
            candidates = list(self._created.values())
        candidates += self._claims.by_index(BY_POD_UID, uid_of(pod))
        for claim in candidates:
            annotations = metadata(claim).get("annotations") or {}
            if (
                namespace_of(claim) == namespace_of(pod)
                and annotations.get(POD_CLAIM_NAME_ANNOTATION) == pod_claim
                and is_owned_by(claim, pod)
                and not is_deleting(claim)
            ):
                return claim
        return None

    def _create(self, pod: JsonObject, pod_claim: str, template_name: str) -> JsonObject:
        namespace = namespace_of(pod)
        template = self._templates.get(template_name, namespace=namespace)
        if template is None:
            try:
                template = self._api.get(
                    RESOURCE_CLAIM_TEMPLATES, name=template_name, namespace=namespace
                )
            except ApiNotFoundError as exc:
                raise ApiNotFoundError(f"resource claim template {template_name!r}: {exc}") from exc
        template_meta = (template.get("spec") or {}).get("metadata") or {}
        annotations = dict(template_meta.get("annotations") or {})
        annotations[POD_CLAIM_NAME_ANNOTATION] = pod_claim
        claim_meta: JsonObject = {
            "generateName": generate_name_base(name_of(pod), pod_claim),
            "namespace": namespace,
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": name_of(pod),
                    "uid": uid_of(pod),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        }
        if template_meta.get("labels"):
            claim_meta["labels"] = dict(template_meta["labels"])
        body: JsonObject = {
            "metadata": claim_meta,
            "spec": copy.deepcopy((template.get("spec") or {}).get("spec") or {}),
        }
        claim = self._api.create(RESOURCE_CLAIMS, body, namespace=namespace)
        with self._lock:
            if self._claims.get(name_of(claim), namespace=namespace) is None:
                self._created[key_for(name=name_of(claim), namespace=namespace)] = claim
        log.info("created claim %s/%s for pod %s", namespace, name_of(claim), name_of(pod))
        return claim

    def _record_statuses(self, pod: JsonObject, new: dict[str, str]) -> None:
        namespace, name = namespace_of(pod), name_of(pod)
        current = pod
        for attempt in range(_STATUS_ATTEMPTS):
            if uid_of(current) != uid_of(pod):
                return
            updated = copy.deepcopy(current)
            status = updated.setdefault("status", {})
            entries = [
                e for e in status.get("resourceClaimStatuses") or [] if e.get("name") not in new
            ]
            entries += [{"name": k, "resourceClaimName": v} for k, v in sorted(new.items())]
            status["resourceClaimStatuses"] = entries
            try:
                self._api.update_status(PODS, updated)
                break
            except ConflictError:
                if attempt == _STATUS_ATTEMPTS - 1:
                    raise
                current = self._api.get(PODS, name=name, namespace=namespace)

    def _pod_gone_or_done(self, namespace: str | None, ref: JsonObject) -> bool:
        uid = str(ref.get("uid") or "")
        with self._lock:
            if uid in self._deleted_pods:
                return True
        name = str(ref.get("name") or "")
        pod = self._pods.get(name, namespace=namespace)
        if pod is None:
            # Not cached (yet?): removing a pod the scheduler is binding would be wrong; ask.
            try:
                pod = self._api.get(PODS, name=name, namespace=namespace)
            except ApiNotFoundError:
                return True
        return uid_of(pod) != uid or is_pod_done(pod)

    def _sync_claim(self, key: str) -> None:
        claim = self._claims.get_by_key(key)
        if claim is None:
            return
        namespace = namespace_of(claim)
        reserved = (claim.get("status") or {}).get("reservedFor") or []
        valid = [
            ref
            for ref in reserved
            if not (
                ref.get("resource") == "pods"
                and not ref.get("apiGroup")
                and self._pod_gone_or_done(namespace, ref)
            )
        ]
        finalizers = list(metadata(claim).get("finalizers") or [])
        protected = DELETE_PROTECTION_FINALIZER in finalizers
        if len(valid) < len(reserved):
            updated = copy.deepcopy(claim)
            updated["status"]["reservedFor"] = valid
            if not valid:
                del updated["status"]["reservedFor"]
                if protected:
                    updated["status"].pop("allocation", None)
            claim = self._api.update_status(RESOURCE_CLAIMS, updated)
            log.info("claim %s: released reservations (%d left)", key, len(valid))
            if protected and not (claim.get("status") or {}).get("allocation"):
                claim = self._drop_finalizer(claim)
        elif protected and is_deleting(claim) and not valid:
            if (claim.get("status") or {}).get("allocation"):
                updated = copy.deepcopy(claim)
                updated["status"].pop("allocation", None)
                claim = self._api.update_status(RESOURCE_CLAIMS, updated)
            claim = self._drop_finalizer(claim)
        if not valid:
            self._delete_if_owner_done(claim)

    def _drop_finalizer(self, claim: JsonObject) -> JsonObject:
        updated = copy.deepcopy(claim)
        finalizers = [
            f for f in metadata(updated).get("finalizers") or [] if f != DELETE_PROTECTION_FINALIZER
        ]
        updated["metadata"]["finalizers"] = finalizers
        try:
            return self._api.update(RESOURCE_CLAIMS, updated)
        except ApiNotFoundError:
            return claim

    def _delete_if_owner_done(self, claim: JsonObject) -> None:
        if is_deleting(claim):
            return
        owner = next(
            (
                ref
                for ref in metadata(claim).get("ownerReferences") or []
                if ref.get("apiVersion") == "v1"
                and ref.get("kind") == "Pod"
                and ref.get("controller")
            ),
            None,
        )
        if owner is None:
            return
        pod = self._pods.get(str(owner.get("name")), namespace=namespace_of(claim))
        if pod is None:
            return  # perhaps not known yet: the garbage collector handles pods that are gone
        if uid_of(pod) != owner.get("uid") or is_pod_done(pod):
            try:
                self._api.delete(
                    RESOURCE_CLAIMS, name=name_of(claim), namespace=namespace_of(claim)
                )
                log.info(
                    "deleted unused generated claim %s/%s", namespace_of(claim), name_of(claim)
                )
            except (ApiNotFoundError, AlreadyExistsError):
                pass
