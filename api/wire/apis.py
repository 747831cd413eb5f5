"""Kinds of the other API groups we touch: ``coordination.k8s.io`` (Lease), ``policy`` (Eviction,
PodDisruptionBudget), ``apps`` (DaemonSet) and ``admission.k8s.io`` (the webhook's answer)."""

from __future__ import annotations

from typing import Literal, Required, TypedDict

from api.wire.meta import DeleteOptions, LabelSelector, ObjectMeta, Status


class LeaseSpec(TypedDict, total=False):
    holderIdentity: str
    leaseDurationSeconds: int
    acquireTime: str | None
    """``MicroTime``; ``None`` when unknown."""
    renewTime: str
    leaseTransitions: int


class Lease(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: LeaseSpec


class Eviction(TypedDict, total=False):
    """The body of a pod's ``eviction`` subresource."""

    apiVersion: str
    kind: str
    metadata: ObjectMeta
    deleteOptions: DeleteOptions


class PodDisruptionBudgetSpec(TypedDict, total=False):
    selector: LabelSelector


class PodDisruptionBudgetStatus(TypedDict, total=False):
    disruptionsAllowed: int


class PodDisruptionBudget(TypedDict, total=False):
    """What preemption reads of a budget."""

    metadata: ObjectMeta
    spec: PodDisruptionBudgetSpec
    status: PodDisruptionBudgetStatus


class DaemonSetSpec(TypedDict, total=False):
    selector: LabelSelector


class DaemonSet(TypedDict, total=False):
    """What ``instaslice uninstall`` reads of the plugin's DaemonSet: which pods are its own."""

    metadata: ObjectMeta
    spec: DaemonSetSpec


class AdmissionResponse(TypedDict, total=False):
    uid: Required[str]
    allowed: Required[bool]
    patchType: Literal["JSONPatch"]
    patch: str
    """The base64 of a JSON patch (a list of ``JsonPatchOperation``)."""
    status: Status
    warnings: list[str]


class AdmissionReview(TypedDict, total=False):
    """``admission.k8s.io/v1``: the webhook's answer (requests are read through ``views``, as
    objects not validated yet)."""

    apiVersion: Required[str]
    kind: Required[str]
    response: AdmissionResponse
