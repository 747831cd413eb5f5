"""CEL device selectors: Kubernetes' syntax, its error rules, and the verdict caches."""

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.allocation.selectors import (
    DeviceView,
    SelectorCompileError,
    SelectorError,
    SelectorEvaluationError,
    compile_selector,
    device_view_from_slice,
    device_views_from_slice,
    matches_all,
)
from driver.errors import ConfigError

DRIVER = "mig.instaslice.dev"
A = f'device.attributes["{DRIVER}"]'
C = f'device.capacity["{DRIVER}"]'


def make_slice(
    devices: list[dict[str, Any]],
    *,
    node: str = "node-a",
    generation: int = 1,
    resource_version: str = "10",
    driver: str = DRIVER,
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-devices", "resourceVersion": resource_version},
        "spec": {
            "driver": driver,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 2},
            "nodeName": node,
            "devices": devices,
        },
    }


def mig_device(
    *, gpu: int = 0, profile: str = "1g.5gb", start: int = 0, memory: str = "5Gi"
) -> dict[str, Any]:
    return {
        "name": f"gpu-{gpu}-{profile.replace('.', '-').replace('+', '-')}-{start}",
        "attributes": {
            "profile": {"string": profile},
            "gpuIndex": {"int": gpu},
            "parentUUID": {"string": f"GPU-{gpu:04d}"},
            "placementStart": {"int": start},
            "mediaExtensions": {"bool": profile.endswith("+me")},
            "driverVersion": {"version": "550.54.15"},
            "vendor.example/tags": {"strings": ["fast", "mig"]},
        },
        "capacity": {"memory": {"value": memory}, "multiprocessors": {"value": "14"}},
    }


def view(**kwargs: Any) -> DeviceView:
    return device_views_from_slice(make_slice([mig_device(**kwargs)]))[0]


DEVICE = view()

MATCH_TABLE = [
    ("driver", f'device.driver == "{DRIVER}"', True),
    ("other-driver", 'device.driver == "gpu.nvidia.com"', False),
    ("profile", f'{A}.profile == "1g.5gb"', True),
    ("profile-index-form", f'{A}["profile"] == "2g.10gb"', False),
    ("gpu-index-lt", f"{A}.gpuIndex < 2", True),
    ("gpu-index-gt", f"{A}.gpuIndex > 0", False),
    ("bool-attribute", f"!{A}.mediaExtensions", True),
    ("domain-in", f'"{DRIVER}" in device.attributes', True),
    ("unknown-domain-in", '"gpu.nvidia.com" in device.attributes', False),
    ("has-missing-field", f"has({A}.notThere)", False),
    (
        "has-guarded-unknown-domain",
        'has(device.attributes["x.dev"].y) && device.attributes["x.dev"].y',
        False,
    ),
    ("has-present-field", f"has({A}.parentUUID)", True),
    ("qualified-foreign-domain", '"mig" in device.attributes["vendor.example"].tags', True),
    (
        "string-function",
        f'{A}.profile.startsWith("1g") && {A}.parentUUID.matches("^GPU-0+$")',
        True,
    ),
    ("memory-compare-ge", f'{C}.memory.compareTo(quantity("10Gi")) >= 0', False),
    ("memory-compare-ge-small", f'{C}.memory.compareTo(quantity("4Gi")) >= 0', True),
    ("memory-greater", f'{C}.memory.isGreaterThan(quantity("5000Mi"))', True),
    ("memory-less", f'{C}.memory.isLessThan(quantity("5Gi"))', False),
    ("memory-equal-other-unit", f'{C}.memory == quantity("5120Mi")', True),
    ("memory-as-integer", f"{C}.memory.asInteger() == 5368709120", True),
    ("quantity-arith", f'{C}.memory.add(quantity("1Gi")).sub(1).isLessThan(quantity("6Gi"))', True),
    (
        "quantity-sign-float",
        'quantity("-1.5").sign() == -1 && quantity("1.5").asApproximateFloat() == 1.5',
        True,
    ),
    ("is-quantity", 'isQuantity("5Gi") && !isQuantity("5 Gi")', True),
    ("semver", f'{A}.driverVersion.isGreaterThan(semver("550.0.0"))', True),
    ("semver-parts", f"{A}.driverVersion.major() == 550 && {A}.driverVersion.minor() == 54", True),
    ("semver-compare", f'{A}.driverVersion.compareTo(semver("550.54.15")) == 0', True),
    ("is-semver", 'isSemver("1.2.3") && !isSemver("1.2")', True),
    ("macro", f"[0, 1].exists(i, i == {A}.gpuIndex)", True),
    ("macro-all", 'device.attributes["vendor.example"].tags.all(t, t.size() > 2)', True),
    ("error-hidden-by-or", f"{A}.missing == 1 || true", True),
    ("error-hidden-by-and", f"false && {A}.missing == 1", False),
    ("ternary", f'{A}.gpuIndex == 0 ? {A}.profile == "1g.5gb" : false', True),
]


@pytest.mark.parametrize(
    ("expression", "expected"), [t[1:] for t in MATCH_TABLE], ids=[t[0] for t in MATCH_TABLE]
)
def test_selector_verdicts(expression: str, expected: bool) -> None:
    selector = compile_selector(expression)
    assert selector.matches(DEVICE) is expected
    assert selector.evaluate(DEVICE) is expected


RUNTIME_ERRORS = [
    ("unknown-domain-field", 'device.attributes["gpu.nvidia.com"].profile == "x"', "no such"),
    ("missing-attribute", f"{A}.notThere == 1", "notThere"),
    ("not-bool", f"{A}.profile", "must evaluate to bool"),
    (
        "both-sides-error",
        f"{A}.missing == 1 && {A}.gone == 2",
        "mapping: 'missing' and no such member",
    ),
    ("quantity-less-operator", f'{C}.memory < quantity("6Gi")', "not supported"),
    ("bad-quantity-literal", 'quantity("five") == quantity("5")', "not a Kubernetes quantity"),
    ("as-integer-fraction", 'quantity("1.5").asInteger() == 1', "not an integer"),
    ("type-mismatch", f"{A}.profile > 3", ""),
    ("compare-wrong-receiver", f'{A}.gpuIndex.compareTo(quantity("1")) == 0', "quantity"),
]


@pytest.mark.parametrize(
    ("expression", "fragment"), [t[1:] for t in RUNTIME_ERRORS], ids=[t[0] for t in RUNTIME_ERRORS]
)
def test_runtime_errors_are_errors_for_the_claim(expression: str, fragment: str) -> None:
    selector = compile_selector(expression)
    for _ in range(2):  # the cached verdict raises the same way
        with pytest.raises(SelectorEvaluationError) as info:
            selector.matches(DEVICE)
        assert fragment in str(info.value)
        assert info.value.expression == expression
        assert info.value.device == (DRIVER, "node-a", DEVICE.name)
        assert DEVICE.name in str(info.value)
        assert isinstance(info.value, ConfigError)


COMPILE_ERRORS = [
    ("syntax-dangling-operator", "device.driver ==", "syntax error at line 1, column 15"),
    ("syntax-unbalanced", f'{A}.profile == "1g.5gb"))', "syntax error"),
    ("syntax-unterminated-string", 'device.driver == "mig', "syntax error"),
    ("empty", "", "syntax error"),
    ("unknown-function", "foo(1)", "undeclared reference to function 'foo'"),
    ("unknown-method", f"{A}.profile.frobnicate()", "'frobnicate'"),
    ("unknown-variable", 'devize.driver == "x"', "undeclared reference to 'devize'"),
    ("unsupported-k8s-function", f'{A}.profile.lowerAscii() == "a"', "not supported by InstaSlice"),
    ("cel-bind", f'cel.bind(d, {A}, d.profile == "1g.5gb")', "'bind' is not supported"),
    ("message-construction", "Foo{a: 1} == 1", "message construction"),
    ("macro-without-variable", "[1].exists(1, true)", "needs a variable"),
    ("too-long", "true || " * 1400 + "true", "longer than 10240"),
]


@pytest.mark.parametrize(
    ("expression", "fragment"), [t[1:] for t in COMPILE_ERRORS], ids=[t[0] for t in COMPILE_ERRORS]
)
def test_malformed_selectors_fail_to_compile_with_a_message(expression: str, fragment: str) -> None:
    for _ in range(2):  # memoized failures raise too
        with pytest.raises(SelectorCompileError) as info:
            compile_selector(expression)
        assert fragment in str(info.value)
        assert info.value.expression == expression
        assert isinstance(info.value, SelectorError)
        assert isinstance(info.value, ConfigError)


def test_compile_is_memoized() -> None:
    assert compile_selector(f'{A}.profile == "3g.20gb"') is compile_selector(
        f'{A}.profile == "3g.20gb"'
    )


def heterogeneous_devices() -> list[DeviceView]:
    devices = []
    for node in ("node-a", "node-b"):
        specs = [
            mig_device(gpu=gpu, profile=profile, start=start, memory=memory)
            for gpu in range(3)
            for profile, memory, starts in (
                ("1g.5gb", "5Gi", 7),
                ("2g.10gb", "10Gi", 3),
                ("1g.5gb+me", "5Gi", 7),
            )
            for start in range(starts)
        ]
        devices += device_views_from_slice(make_slice(specs, node=node))
    foreign = make_slice(
        [{"name": "gpu-0", "attributes": {"model": {"string": "A100"}}}], driver="gpu.nvidia.com"
    )
    devices += device_views_from_slice(foreign)
    return devices


def outcome(check: Callable[[DeviceView], bool], device: DeviceView) -> bool | str:
    try:
        return check(device)
    except SelectorEvaluationError as exc:
        return str(exc)


SHARED_VERDICT_EXPRESSIONS = [
    f'{A}.profile == "1g.5gb"',
    f'{A}.gpuIndex < 2 && {C}.memory.compareTo(quantity("10Gi")) >= 0',
    f'"{DRIVER}" in device.attributes && {A}.placementStart >= 3',
    f'has({A}.profile) && {A}.profile.endsWith("+me")',
    'device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].model == "A100"',
]


@pytest.mark.parametrize(
    "expression", SHARED_VERDICT_EXPRESSIONS, ids=range(len(SHARED_VERDICT_EXPRESSIONS))
)
def test_shared_verdicts_equal_per_device_evaluation(expression: str) -> None:
    selector = compile_selector(expression)
    selector.clear_cache()
    devices = heterogeneous_devices()
    assert selector.projected
    for device in devices:
        assert outcome(selector.matches, device) == outcome(selector.evaluate, device), (
            device.device_id
        )
    selector.clear_cache()
    selector.evaluations = 0
    for device in devices:
        outcome(selector.matches, device)
    # one real evaluation per distinct combination of values read, far fewer than devices
    assert 0 < selector.evaluations < len(devices) / 4


def test_profile_selector_runs_once_per_distinct_profile() -> None:
    selector = compile_selector(f'{A}.profile == "2g.10gb" && device.driver == "{DRIVER}"')
    selector.clear_cache()
    selector.evaluations = 0
    matched = [d for d in heterogeneous_devices() if d.driver == DRIVER and selector.matches(d)]
    assert len(matched) == 2 * 3 * 3
    assert selector.evaluations == 3


def test_opaque_selectors_cache_per_device_and_slice_version() -> None:
    selector = compile_selector('device.attributes.exists(d, d == "vendor.example")')
    assert not selector.projected
    selector.clear_cache()
    selector.evaluations = 0
    first = view(gpu=1)
    assert selector.matches(first)
    assert selector.matches(first)
    assert selector.evaluations == 1
    republished = device_views_from_slice(
        make_slice([mig_device(gpu=1)], generation=2, resource_version="11")
    )[0]
    assert republished.device_id == first.device_id
    assert selector.matches(republished)
    assert selector.evaluations == 2


def test_matches_all_stops_at_the_first_false() -> None:
    class_selector = compile_selector(f'{A}.profile == "7g.40gb"')
    failing = compile_selector(f"{A}.notThere == 1")
    assert matches_all([class_selector, failing], DEVICE) is False
    with pytest.raises(SelectorEvaluationError):
        matches_all([compile_selector("true"), failing], DEVICE)
    assert matches_all([], DEVICE) is True


def test_device_view_from_slice_maps_names_and_values() -> None:
    slice_obj = make_slice([], node="node-z", generation=4, resource_version="99")
    device = device_view_from_slice(
        slice_obj, mig_device(gpu=2, profile="3g.20gb", start=4, memory="20Gi")
    )
    assert device.device_id == (DRIVER, "node-z", "gpu-2-3g-20gb-4")
    assert device.node_name == "node-z"
    assert device.pool_generation == 4
    assert device.cache_key == (DRIVER, "node-z", "gpu-2-3g-20gb-4", 4, "node-z-devices", "99")
    assert device.attributes[DRIVER]["profile"] == "3g.20gb"
    assert device.attributes[DRIVER]["gpuIndex"] == 2
    assert str(device.attributes[DRIVER]["driverVersion"]) == "550.54.15"
    assert device.attributes["vendor.example"]["tags"] == ("fast", "mig")
    assert device.capacity[DRIVER]["memory"].value == 20 * 2**30


def test_device_view_accepts_the_v1beta1_basic_shape() -> None:
    beta = {
        "name": "gpu-0-1g-5gb-0",
        "basic": {
            "attributes": {"profile": {"string": "1g.5gb"}},
            "capacity": {"memory": {"value": "5Gi"}},
        },
    }
    device = device_view_from_slice(make_slice([]), beta)
    assert compile_selector(f'{A}.profile == "1g.5gb"').evaluate(device)


def test_counter_only_slice_has_no_devices() -> None:
    counters = make_slice([])
    del counters["spec"]["devices"]
    counters["spec"]["sharedCounters"] = [
        {"name": "gpu-0", "counters": {"memory-slice-0": {"value": "1"}}}
    ]
    assert device_views_from_slice(counters) == []


@pytest.mark.parametrize(
    ("attributes", "capacity", "fragment"),
    [
        ({"profile": {}}, {}, "exactly one value field"),
        ({"profile": {"string": "a", "int": 1}}, {}, "exactly one value field"),
        ({"profile": {"float": 1.5}}, {}, "unsupported attribute value"),
        ({"gpuIndex": {"int": "0"}}, {}, "unsupported attribute value"),
        ({"driverVersion": {"version": "1.2"}}, {}, "semantic version"),
        ({}, {"memory": {"value": "lots"}}, "not a Kubernetes quantity"),
    ],
    ids=["empty", "two-values", "unknown-type", "int-as-string", "bad-version", "bad-quantity"],
)
def test_malformed_published_devices_raise_config_error(
    attributes: dict[str, Any], capacity: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(ConfigError, match=fragment) as info:
        device_view_from_slice(
            make_slice([]), {"name": "broken", "attributes": attributes, "capacity": capacity}
        )
    assert "'broken'" in str(info.value)


def test_class_selectors_need_a_driver_guard_against_other_drivers_devices() -> None:
    foreign = heterogeneous_devices()[-1]
    assert foreign.driver == "gpu.nvidia.com"
    with pytest.raises(SelectorEvaluationError, match="no such member"):
        compile_selector(f'{A}.profile == "1g.5gb"').matches(foreign)
    guarded = compile_selector(f'device.driver == "{DRIVER}" && {A}.profile == "1g.5gb"')
    assert guarded.matches(foreign) is False
    assert guarded.matches(DEVICE) is True


def test_concurrent_evaluation_gives_the_same_verdicts() -> None:
    devices = heterogeneous_devices()
    expressions = [f'{A}.placementStart == {n} && device.driver == "{DRIVER}"' for n in range(7)]
    expected = {
        expr: [compile_selector(expr).evaluate(d) for d in devices if d.driver == DRIVER]
        for expr in expressions
    }
    for expr in expressions:
        compile_selector(expr).clear_cache()
    results: dict[str, list[bool]] = {}

    def work(expr: str) -> None:
        selector = compile_selector(expr)
        results[expr] = [selector.matches(d) for d in devices if d.driver == DRIVER]

    threads = [threading.Thread(target=work, args=(e,)) for e in expressions * 2]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == expected


def test_deployed_device_class_selectors_compile_and_share_verdicts() -> None:
    path = Path(__file__).resolve().parents[2] / "deploy" / "base" / "deviceclasses.yaml"
    classes = [
        doc
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") == "DeviceClass"
    ]
    assert classes
    for device_class in classes:
        for selector in device_class["spec"].get("selectors", []):
            compiled = compile_selector(selector["cel"]["expression"])
            assert compiled.projected, device_class["metadata"]["name"]
            assert compiled.matches(heterogeneous_devices()[-1]) is False  # another driver's device
    one_g = compile_selector(
        next(c for c in classes if c["metadata"]["name"] == "mig-1g.5gb.instaslice.dev")["spec"][
            "selectors"
        ][0]["cel"]["expression"]
    )
    assert one_g.matches(DEVICE) is True
