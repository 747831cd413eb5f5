"""Built-in MIG tables for the emulated backend, from docs/design.md F18 and F19.

Real hardware never uses this catalog: the NVML backend reads profiles and placements from the GPU.
Placements are the hardware's, in NVML order; memory and SM figures are what ``nvidia-smi mig -lgip``
reports (they vary slightly with the driver). B200 figures marked ``captured=False`` were not captured
on hardware in the sources; they are estimates that follow the 8-slice pattern.
"""

from types import MappingProxyType
from typing import Final

from driver.errors import ConfigError
from driver.mig.model import CI_PROFILE_BY_COMPUTE_SLICES, MIB, GpuModel, MigProfile, Placement

# NVML GPU-instance profile ids on GPUs with 8 memory slices (identical on every such GPU).
_GI_1G: Final = 19
_GI_1G_ME: Final = 20
_GI_1G_2X: Final = 15
_GI_2G: Final = 14
_GI_3G: Final = 9
_GI_4G: Final = 5
_GI_7G: Final = 0


def _starts(*starts: int, size: int) -> tuple[Placement, ...]:
    return tuple(Placement(start=s, size=size) for s in starts)


def _profile(
    name: str,
    *,
    gi_id: int,
    memory_slices: int,
    compute_slices: int,
    gib: float,
    sms: int,
    max_count: int,
    placements: tuple[Placement, ...],
    captured: bool = True,
) -> MigProfile:
    return MigProfile(
        name=name,
        gi_profile_id=gi_id,
        ci_profile_id=CI_PROFILE_BY_COMPUTE_SLICES[compute_slices],
        memory_slices=memory_slices,
        compute_slices=compute_slices,
        memory_bytes=round(gib * 1024) * MIB,
        multiprocessors=sms,
        media_extensions=name.endswith("+me"),
        max_count=max_count,
        placements=placements,
        captured=captured,
    )


def _eight_slice_profiles(
    *,
    one_g: tuple[str, float, int],
    one_g_2x: tuple[str, float, int],
    two_g: tuple[str, float, int],
    three_g: tuple[str, float, int],
    four_g: tuple[str, float, int],
    seven_g: tuple[str, float, int],
    captured_from_3g: bool = True,
) -> tuple[MigProfile, ...]:
    """The seven profiles of an 8-memory-slice GPU: each argument is (name, GiB, SMs)."""
    c = captured_from_3g
    return (
        _profile(one_g[0], gi_id=_GI_1G, memory_slices=1, compute_slices=1, gib=one_g[1],
                 sms=one_g[2], max_count=7, placements=_starts(0, 1, 2, 3, 4, 5, 6, size=1)),
        _profile(one_g[0] + "+me", gi_id=_GI_1G_ME, memory_slices=1, compute_slices=1,
                 gib=one_g[1], sms=one_g[2], max_count=1,
                 placements=_starts(0, 1, 2, 3, 4, 5, 6, size=1)),
        _profile(one_g_2x[0], gi_id=_GI_1G_2X, memory_slices=2, compute_slices=1,
                 gib=one_g_2x[1], sms=one_g_2x[2], max_count=4,
                 placements=_starts(0, 2, 4, 6, size=2)),
        _profile(two_g[0], gi_id=_GI_2G, memory_slices=2, compute_slices=2, gib=two_g[1],
                 sms=two_g[2], max_count=3, placements=_starts(0, 2, 4, size=2)),
        _profile(three_g[0], gi_id=_GI_3G, memory_slices=4, compute_slices=3, gib=three_g[1],
                 sms=three_g[2], max_count=2, placements=_starts(0, 4, size=4), captured=c),
        _profile(four_g[0], gi_id=_GI_4G, memory_slices=4, compute_slices=4, gib=four_g[1],
                 sms=four_g[2], max_count=1, placements=_starts(0, size=4), captured=c),
        _profile(seven_g[0], gi_id=_GI_7G, memory_slices=8, compute_slices=7, gib=seven_g[1],
                 sms=seven_g[2], max_count=1, placements=_starts(0, size=8), captured=c),
    )  # fmt: skip


def _a30_profiles() -> tuple[MigProfile, ...]:
    return (
        _profile("1g.6gb", gi_id=14, memory_slices=1, compute_slices=1, gib=5.81, sms=14,
                 max_count=4, placements=_starts(0, 1, 2, 3, size=1)),
        _profile("1g.6gb+me", gi_id=21, memory_slices=1, compute_slices=1, gib=5.81, sms=14,
                 max_count=1, placements=_starts(0, 1, 2, 3, size=1)),
        _profile("2g.12gb", gi_id=5, memory_slices=2, compute_slices=2, gib=11.69, sms=28,
                 max_count=2, placements=_starts(0, 2, size=2)),
        _profile("2g.12gb+me", gi_id=6, memory_slices=2, compute_slices=2, gib=11.69, sms=28,
                 max_count=1, placements=_starts(0, 2, size=2)),
        _profile("4g.24gb", gi_id=0, memory_slices=4, compute_slices=4, gib=23.44, sms=56,
                 max_count=1, placements=_starts(0, size=4)),
    )  # fmt: skip


def _gpu(
    name: str, product: str, *, gib: float, sms: int, profiles: tuple[MigProfile, ...]
) -> GpuModel:
    memory_slices = max(p.placements[-1].end for p in profiles)
    compute_slices = max(p.compute_slices for p in profiles)
    return GpuModel(
        name=name,
        product_name=product,
        memory_bytes=round(gib * 1024) * MIB,
        memory_slices=memory_slices,
        compute_slices=compute_slices,
        multiprocessors=sms,
        profiles=profiles,
    )


CATALOG: Final[MappingProxyType[str, GpuModel]] = MappingProxyType(
    {
        g.name: g
        for g in (
            _gpu("A100-40GB", "NVIDIA A100-SXM4-40GB", gib=40, sms=108,
                 profiles=_eight_slice_profiles(
                     one_g=("1g.5gb", 4.75, 14), one_g_2x=("1g.10gb", 9.75, 14),
                     two_g=("2g.10gb", 9.62, 28), three_g=("3g.20gb", 19.50, 42),
                     four_g=("4g.20gb", 19.50, 56), seven_g=("7g.40gb", 39.50, 98))),
            _gpu("A100-80GB", "NVIDIA A100-SXM4-80GB", gib=80, sms=108,
                 profiles=_eight_slice_profiles(
                     one_g=("1g.10gb", 9.50, 14), one_g_2x=("1g.20gb", 19.50, 14),
                     two_g=("2g.20gb", 19.50, 28), three_g=("3g.40gb", 39.50, 42),
                     four_g=("4g.40gb", 39.50, 56), seven_g=("7g.80gb", 79.25, 98))),
            _gpu("A30-24GB", "NVIDIA A30", gib=24, sms=56, profiles=_a30_profiles()),
            _gpu("H100-80GB", "NVIDIA H100 80GB HBM3", gib=79.65, sms=132,
                 profiles=_eight_slice_profiles(
                     one_g=("1g.10gb", 9.75, 16), one_g_2x=("1g.20gb", 19.62, 26),
                     two_g=("2g.20gb", 19.62, 32), three_g=("3g.40gb", 39.50, 60),
                     four_g=("4g.40gb", 39.50, 64), seven_g=("7g.80gb", 79.25, 132))),
            _gpu("H100-94GB", "NVIDIA H100 NVL", gib=93.58, sms=132,
                 profiles=_eight_slice_profiles(
                     one_g=("1g.12gb", 10.75, 16), one_g_2x=("1g.24gb", 21.62, 26),
                     two_g=("2g.24gb", 21.62, 32), three_g=("3g.47gb", 46.38, 60),
                     four_g=("4g.47gb", 46.38, 64), seven_g=("7g.94gb", 93.12, 132))),
            _gpu("H200-141GB", "NVIDIA H200", gib=140.4, sms=132,
                 profiles=_eight_slice_profiles(
                     one_g=("1g.18gb", 16.00, 16), one_g_2x=("1g.35gb", 32.25, 26),
                     two_g=("2g.35gb", 32.25, 32), three_g=("3g.71gb", 69.50, 60),
                     four_g=("4g.71gb", 69.50, 64), seven_g=("7g.141gb", 139.75, 132))),
            _gpu("B200-180GB", "NVIDIA B200", gib=179.06, sms=148,
                 profiles=_eight_slice_profiles(
                     one_g=("1g.23gb", 22.00, 18), one_g_2x=("1g.45gb", 44.25, 30),
                     two_g=("2g.45gb", 44.25, 36), three_g=("3g.90gb", 88.50, 54),
                     four_g=("4g.90gb", 88.50, 72), seven_g=("7g.180gb", 177.00, 144),
                     captured_from_3g=False)),
        )
    }
)  # fmt: skip


def gpu_model(name: str) -> GpuModel:
    """The catalog entry for ``name`` (case-insensitive, e.g. ``a100-40gb``); ``ConfigError`` if none."""
    for key, model in CATALOG.items():
        if key.lower() == name.strip().lower():
            return model
    raise ConfigError(f"unknown GPU model {name!r} (known: {', '.join(CATALOG)})")
