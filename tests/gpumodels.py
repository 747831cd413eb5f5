"""A GPU model that is not in ``driver.mig.catalog``, for the fake NVML.

Shaped like a 4-memory-slice MIG GPU with 96 GB (1g, 2g and 4g profiles, 4/2/1 instances). The
name, figures and profile ids are illustrative, chosen so that no catalog entry matches: the point
is that whatever NVML reports is published as it reports it.
"""

from driver.mig.model import CI_PROFILE_BY_COMPUTE_SLICES, MIB, GpuModel, MigProfile, Placement

UNCATALOGUED_PRODUCT = "NVIDIA Example GPU 96GB"


def _profile(name: str, *, gi_id: int, slices: int, gib: int, sms: int) -> MigProfile:
    return MigProfile(
        name=name,
        gi_profile_id=gi_id,
        ci_profile_id=CI_PROFILE_BY_COMPUTE_SLICES[slices],
        memory_slices=slices,
        compute_slices=slices,
        memory_bytes=gib * 1024 * MIB,
        multiprocessors=sms,
        media_extensions=False,
        max_count=4 // slices,
        placements=tuple(Placement(start=s, size=slices) for s in range(0, 4, slices)),
    )


def uncatalogued_model() -> GpuModel:
    return GpuModel(
        name="Example-96GB",
        product_name=UNCATALOGUED_PRODUCT,
        memory_bytes=96 * 1024 * 1024 * MIB,
        memory_slices=4,
        compute_slices=4,
        multiprocessors=188,
        profiles=(
            _profile("1g.24gb", gi_id=14, slices=1, gib=23, sms=46),
            _profile("2g.48gb", gi_id=5, slices=2, gib=47, sms=94),
            _profile("4g.96gb", gi_id=0, slices=4, gib=95, sms=188),
        ),
    )
