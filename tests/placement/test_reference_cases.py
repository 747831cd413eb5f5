"""Table-driven MIG cases: the MIG rules (docs/design.md F18) and the public InstaSlice's
weaknesses (docs/design.md "What the public InstaSlice got wrong").

Each case places pods one after another on one node and states where each slice lands — GPU index
and placement start — or that it cannot land anywhere.
"""

from dataclasses import dataclass, field

import pytest

from driver.mig.catalog import gpu_model
from driver.placement import Engine, GpuSpec, NodeSpec, NoFit, Placed, PodRequest

Where = tuple[int, int] | None
"""(GPU index, placement start), or None for "no fit"."""


@dataclass(frozen=True)
class Case:
    id: str
    model: str
    steps: tuple[tuple[str, Where], ...]
    policy: str = "firstfit"
    gpus: int = 1
    occupied: tuple[tuple[int, str, int], ...] = field(default=())
    """Instances created beforehand by anyone: (GPU index, profile, start)."""


def on(start: int, gpu: int = 0) -> Where:
    return (gpu, start)


NO_FIT: Where = None

CASES = (
    # The reference's fragmentation example: 2 x 1g at 0,1, then 2g lands at 2 and 4, leaving
    # slots 6-7 unusable for a 2g (starts 0,2,4 only) but usable for a 1g.10gb-class slice at 6.
    Case("a100-2x1g-then-2g-at-2-and-4-then-1g.10gb-at-6", "A100-40GB", (
        ("1g.5gb", on(0)), ("1g.5gb", on(1)), ("2g.10gb", on(2)), ("2g.10gb", on(4)),
        ("2g.10gb", NO_FIT), ("1g.10gb", on(6)), ("1g.5gb", NO_FIT),
    )),
    Case("a100-slot-7-is-never-a-start", "A100-40GB", (
        ("1g.5gb", on(0)), ("1g.5gb", on(1)), ("2g.10gb", on(2)), ("2g.10gb", on(4)),
        ("1g.5gb", on(6)), ("1g.5gb", NO_FIT),
    )),
    Case("a100-seven-1g-then-full", "A100-40GB", tuple(
        [("1g.5gb", on(s)) for s in range(7)] + [("1g.5gb", NO_FIT)]
    )),
    Case("a100-7g-needs-the-whole-gpu", "A100-40GB", (
        ("7g.40gb", on(0)), ("1g.5gb", NO_FIT), ("7g.40gb", NO_FIT),
    )),
    Case("a100-one-1g-blocks-the-7g", "A100-40GB", (("1g.5gb", on(0)), ("7g.40gb", NO_FIT))),
    Case("a100-3g-at-0-and-4-fill-the-gpu", "A100-40GB", (
        ("3g.20gb", on(0)), ("3g.20gb", on(4)), ("1g.5gb", NO_FIT),
    )),
    Case("a100-4g-then-3g", "A100-40GB", (
        ("4g.20gb", on(0)), ("3g.20gb", on(4)), ("4g.20gb", NO_FIT),
    )),
    Case("a100-1g-at-0-blocks-4g-not-3g-at-4", "A100-40GB", (
        ("1g.5gb", on(0)), ("4g.20gb", NO_FIT), ("3g.20gb", on(4)),
    )),
    Case("a100-external-3g-at-4-leaves-4g-at-0", "A100-40GB", (
        ("4g.20gb", on(0)), ("1g.5gb", NO_FIT),
    ), occupied=((0, "3g.20gb", 4),)),
    Case("a100-one-me-per-gpu", "A100-40GB", (
        ("1g.5gb+me", on(0)), ("1g.5gb+me", NO_FIT), ("1g.5gb", on(1)),
    )),
    Case("a100-external-me-blocks-ours", "A100-40GB", (
        ("1g.5gb+me", NO_FIT), ("1g.5gb", on(0)),
    ), occupied=((0, "1g.5gb+me", 3),)),
    Case("a100-1g.10gb-takes-two-slices-at-even-starts", "A100-40GB", (
        ("1g.5gb", on(0)), ("1g.10gb", on(2)), ("1g.10gb", on(4)), ("1g.10gb", on(6)),
        ("1g.10gb", NO_FIT), ("1g.5gb", on(1)),
    )),
    Case("a100-gpus-in-index-order", "A100-40GB", (
        ("7g.40gb", on(0, gpu=0)), ("3g.20gb", on(0, gpu=1)), ("4g.20gb", NO_FIT),
        ("3g.20gb", on(4, gpu=1)), ("1g.5gb", NO_FIT),
    ), gpus=2),
    Case("h100-1g.10gb-is-one-slice", "H100-80GB", (
        ("1g.10gb", on(0)), ("1g.10gb", on(1)), ("1g.20gb", on(2)), ("2g.20gb", on(4)),
        ("1g.20gb", on(6)), ("1g.10gb", NO_FIT),
    )),
    Case("h100-seven-1g", "H100-80GB", tuple(
        [("1g.10gb", on(s)) for s in range(7)] + [("1g.10gb", NO_FIT)]
    )),
    Case("h100-3g-4g", "H100-80GB", (
        ("3g.40gb", on(0)), ("4g.40gb", NO_FIT), ("3g.40gb", on(4)),
    )),
    Case("a30-four-1g", "A30-24GB", tuple(
        [("1g.6gb", on(s)) for s in range(4)] + [("1g.6gb", NO_FIT)]
    )),
    Case("a30-2g-at-0-and-2", "A30-24GB", (
        ("2g.12gb", on(0)), ("2g.12gb", on(2)), ("1g.6gb", NO_FIT),
    )),
    Case("a30-one-me-across-profiles", "A30-24GB", (
        ("2g.12gb+me", on(0)), ("1g.6gb+me", NO_FIT), ("2g.12gb+me", NO_FIT), ("1g.6gb", on(2)),
    )),
    Case("a30-4g-takes-the-gpu", "A30-24GB", (("4g.24gb", on(0)), ("1g.6gb", NO_FIT))),
    # bestfit keeps the most (weighted) placements open: small slices go high, big ones stay possible.
    Case("bestfit-1g-fills-the-upper-half-first", "A100-40GB", (
        ("1g.5gb", on(6)), ("1g.5gb", on(4)), ("1g.5gb", on(5)), ("4g.20gb", on(0)),
    ), policy="bestfit"),
    Case("bestfit-3g-goes-to-4-keeping-the-4g", "A100-40GB", (
        ("3g.20gb", on(4)), ("4g.20gb", on(0)),
    ), policy="bestfit"),
    Case("bestfit-2g-at-4-then-1g-at-6", "A100-40GB", (
        ("2g.10gb", on(4)), ("1g.5gb", on(6)), ("4g.20gb", on(0)),
    ), policy="bestfit"),
    Case("bestfit-1g-joins-an-already-split-half", "A100-40GB", (
        ("1g.5gb", on(1, gpu=0)), ("7g.40gb", on(0, gpu=1)),
    ), policy="bestfit", gpus=2, occupied=((0, "1g.5gb", 0),)),
    Case("bestfit-a30-1g-pairs-up-leaving-a-2g", "A30-24GB", (
        ("1g.6gb", on(0)), ("1g.6gb", on(1)), ("2g.12gb", on(2)),
    ), policy="bestfit"),
    Case("bestfit-a30-1g-next-to-an-external-one", "A30-24GB", (
        ("1g.6gb", on(3)), ("2g.12gb", on(0)),
    ), policy="bestfit", occupied=((0, "1g.6gb", 2),)),
)  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_reference_case(case: Case) -> None:
    model = gpu_model(case.model)
    engine = Engine(policy=case.policy)
    engine.set_node(
        NodeSpec(name="node-a", gpus=tuple(GpuSpec(index=i, model=model) for i in range(case.gpus)))
    )
    for gpu, profile_name, start in case.occupied:
        profile = model.profile(profile_name)
        engine.occupy(
            "node-a",
            gpu,
            start=start,
            size=profile.memory_slices,
            media=profile.media_extensions,
            profile=profile_name,
        )
    got: list[tuple[str, Where]] = []
    for profile_name, _ in case.steps:
        result = engine.place(PodRequest.single(profile_name))
        if isinstance(result, Placed):
            engine.commit(result)
            (a,) = result.assignments
            got.append((profile_name, (a.gpu_index, a.start)))
        else:
            assert isinstance(result, NoFit)
            assert not result.permanent, result.reason
            got.append((profile_name, None))
    assert got == list(case.steps)
