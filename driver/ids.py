"""Distinct types for the ids that flow between layers, so they cannot be mixed up."""

from typing import NewType

ClaimUid = NewType("ClaimUid", str)
PodUid = NewType("PodUid", str)
GpuUuid = NewType("GpuUuid", str)
MigUuid = NewType("MigUuid", str)
