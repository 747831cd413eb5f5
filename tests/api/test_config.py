"""The opaque claim config: what users may write, and the messages they get when it is wrong."""

from collections.abc import Mapping
from typing import Any

import pytest

from api.config import (
    CONFIG_API_VERSION,
    CONFIG_KIND,
    MigDeviceConfig,
    default_config,
    merge_configs,
    parse_opaque_config,
)
from api.errors import ValidationFailed

ENVELOPE = {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND}


def _params(**fields: Any) -> dict[str, Any]:
    return {**ENVELOPE, **fields}


def test_the_envelope_alone_is_a_config_with_no_extra_env() -> None:
    config = parse_opaque_config(ENVELOPE)
    assert config == default_config()
    assert config.env == {}


def test_env_is_accepted_as_written() -> None:
    config = parse_opaque_config(_params(env={"HF_HOME": "/models", "_X1": ""}))
    assert config.env == {"HF_HOME": "/models", "_X1": ""}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (_params(foo=1), ["unknown field 'foo' in MigDeviceConfig"]),
        (
            _params(computeInstanceProfile="1c.2g.10gb"),
            ["unknown field 'computeInstanceProfile' in MigDeviceConfig"],
        ),
        (
            {"kind": CONFIG_KIND},
            ["missing required field 'apiVersion' in MigDeviceConfig"],
        ),
        (
            {**ENVELOPE, "apiVersion": "resource.nvidia.com/v1beta1"},
            [
                "MigDeviceConfig.apiVersion: Input should be 'mig.instaslice.dev/v1alpha1' "
                "(got 'resource.nvidia.com/v1beta1')"
            ],
        ),
        (
            {**ENVELOPE, "kind": "GpuConfig"},
            ["MigDeviceConfig.kind: Input should be 'MigDeviceConfig' (got 'GpuConfig')"],
        ),
        (
            _params(env={"FOO": 1}),
            ["MigDeviceConfig.env.FOO: Input should be a valid string (got 1)"],
        ),
        (
            _params(env=["FOO=1"]),
            ["MigDeviceConfig.env: Input should be a valid dictionary (got ['FOO=1'])"],
        ),
    ],
    ids=[
        "unknown-field",
        "ci-profile-not-offered",
        "missing",
        "api-version",
        "kind",
        "env-int",
        "env-list",
    ],
)
def test_validation_messages_name_the_field_and_the_value(
    raw: Mapping[str, Any], expected: list[str]
) -> None:
    with pytest.raises(ValidationFailed) as info:
        parse_opaque_config(raw)
    assert list(info.value.problems) == expected
    assert str(info.value) == "; ".join(expected)


def test_every_problem_gets_its_own_line() -> None:
    with pytest.raises(ValidationFailed) as info:
        parse_opaque_config({"apiVersion": "v1", "kind": CONFIG_KIND, "foo": 1, "bar": 2})
    problems = info.value.problems
    assert len(problems) == 3
    assert "unknown field 'foo' in MigDeviceConfig" in problems
    assert "unknown field 'bar' in MigDeviceConfig" in problems


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("1ABC", "is not a valid variable name"),
        ("MY-VAR", "is not a valid variable name"),
        ("", "is not a valid variable name"),
        ("A=B", "is not a valid variable name"),
        ("NVIDIA_VISIBLE_DEVICES", "is reserved"),
        ("INSTASLICE_MIG_UUID_X", "is reserved"),
    ],
    ids=["digit-first", "dash", "empty", "equals", "visibility-var", "our-prefix"],
)
def test_env_names_are_checked(name: str, fragment: str) -> None:
    with pytest.raises(ValidationFailed) as info:
        parse_opaque_config(_params(env={name: "x"}))
    (problem,) = info.value.problems
    assert problem.startswith("MigDeviceConfig.env: env name")
    assert repr(name) in problem
    assert fragment in problem


def test_a_nul_in_a_value_is_refused() -> None:
    with pytest.raises(ValidationFailed, match="NUL"):
        parse_opaque_config(_params(env={"A": "x\x00y"}))


@pytest.mark.parametrize(
    "raw", [["apiVersion"], "MigDeviceConfig", None], ids=["list", "str", "none"]
)
def test_parameters_must_be_an_object(raw: Any) -> None:
    with pytest.raises(ValidationFailed, match="parameters must be an object"):
        parse_opaque_config(raw)


def test_later_configs_override_earlier_ones_variable_by_variable() -> None:
    from_class = parse_opaque_config(_params(env={"A": "class", "B": "class"}))
    from_claim = parse_opaque_config(_params(env={"B": "claim", "C": "claim"}))
    merged = merge_configs([from_class, from_claim])
    assert merged.env == {"A": "class", "B": "claim", "C": "claim"}
    assert merge_configs([]) == default_config()


def test_config_is_frozen() -> None:
    config = parse_opaque_config(ENVELOPE)
    with pytest.raises(ValueError, match="frozen"):
        config.kind = "Other"  # type: ignore[assignment]
    assert isinstance(config, MigDeviceConfig)
