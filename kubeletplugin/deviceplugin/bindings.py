"""The shim's part of the node checkpoint: which shadow claim's slices went to which device ids.

A claim the shim prepared carries a ``ShimBinding`` in its checkpoint entry (``api.checkpoint``):

- ``device_plugin_ids`` — the ids the kubelet passed to the ``Allocate`` that received the claim's
  slices; empty when the claim is prepared but not (or no longer) bound to any ids;
- ``pod_uid`` / ``container_name`` — unknown until the pod-resources API shows which container holds
  those ids, then the container that really uses the slices.

States of a prepared shadow claim, and what they mean to ``Allocate`` and the reconciler:

==================  ===============  ===========================================================
ids                 pod_uid          meaning
==================  ===============  ===========================================================
set                 None             answered to ``Allocate``; holder not seen yet
set                 set              held by that pod's container (or held until it went away)
empty               None             prepared, free to be bound by the next ``Allocate``
empty               set              its pod used it and is gone; kept until the claim is released
==================  ===============  ===========================================================

The checkpoint object is the kubelet plugin's own (``DeviceState`` writes claims through it); the
shim only rewrites the ``shim`` field of entries, through the same object, so both see one state.
"""

from collections.abc import Callable, Iterable
from typing import Protocol

from api.checkpoint import Checkpoint, PreparedClaim, PrepareState, ShimBinding


class CheckpointAccess(Protocol):
    """The plugin's checkpoint (``CheckpointStore`` or the plugin's in-memory journal over it)."""

    def load(self) -> Checkpoint: ...

    def update(self, change: Callable[[Checkpoint], Checkpoint]) -> Checkpoint: ...


def shim_entries(checkpoint: Checkpoint) -> list[PreparedClaim]:
    """Completed entries the shim prepared (with a ``ShimBinding``)."""
    return [
        entry
        for entry in checkpoint.claims.values()
        if entry.shim is not None and entry.state is PrepareState.PREPARE_COMPLETED
    ]


def is_bindable(entry: PreparedClaim | None) -> bool:
    """True if ``Allocate`` may bind this claim: not prepared, or prepared and free."""
    if entry is None:
        return True
    if entry.state is not PrepareState.PREPARE_COMPLETED:
        return False
    return entry.shim is None or (not entry.shim.device_plugin_ids and entry.shim.pod_uid is None)


def bound_ids(checkpoint: Checkpoint, resource: str) -> dict[str, PreparedClaim]:
    """Device id of ``resource`` → the entry bound to it."""
    return {
        device_id: entry
        for entry in shim_entries(checkpoint)
        if entry.shim is not None and entry.shim.resource_name == resource
        for device_id in entry.shim.device_plugin_ids
    }


def with_binding(
    checkpoint: Checkpoint, uid: str, change: Callable[[ShimBinding | None], ShimBinding]
) -> Checkpoint:
    """``checkpoint`` with entry ``uid``'s binding replaced by ``change(old)``; unchanged (the same
    object) if the entry is gone or the binding is equal."""
    entry = checkpoint.claim(uid)
    if entry is None:
        return checkpoint
    binding = change(entry.shim)
    if binding == entry.shim:
        return checkpoint
    return checkpoint.with_claim(entry.model_copy(update={"shim": binding}))


def set_bindings(
    checkpoint_access: CheckpointAccess,
    changes: Iterable[tuple[str, Callable[[ShimBinding | None], ShimBinding]]],
) -> Checkpoint:
    """Apply several binding changes in one checkpoint update."""
    pending = list(changes)

    def apply(checkpoint: Checkpoint) -> Checkpoint:
        for uid, change in pending:
            checkpoint = with_binding(checkpoint, uid, change)
        return checkpoint

    if not pending:
        return checkpoint_access.load()
    return checkpoint_access.update(apply)


def bound(resource: str, ids: Iterable[str]) -> Callable[[ShimBinding | None], ShimBinding]:
    """Change: bound to ``ids`` by a fresh ``Allocate`` (holder not known yet)."""
    return lambda _: ShimBinding(resource_name=resource, device_plugin_ids=tuple(ids))


def unbound(resource: str) -> Callable[[ShimBinding | None], ShimBinding]:
    """Change: ids dropped, holder kept (a used claim stays used; a fresh one becomes free)."""

    def change(old: ShimBinding | None) -> ShimBinding:
        if old is None:
            return ShimBinding(resource_name=resource)
        return old.model_copy(update={"device_plugin_ids": ()})

    return change


def held_by(
    *, pod_uid: str, container: str, pod_name: str, namespace: str
) -> Callable[[ShimBinding | None], ShimBinding]:
    """Change: the holder the pod-resources API showed."""
    holder = {
        "pod_uid": pod_uid,
        "container_name": container,
        "pod_name": pod_name,
        "pod_namespace": namespace,
    }

    def change(old: ShimBinding | None) -> ShimBinding:
        if old is None:  # pragma: no cover - only bound entries get a holder
            raise ValueError("a holder is recorded only for a bound claim")
        return old.model_copy(update=holder)

    return change
