"""Start-up checks of the paths a daemon's flags name: a directory it cannot write or make, or a
file that is not one, is a ``ConfigError`` naming the flag; the checks create nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from driver.daemon.paths import check_file, check_writable_directory
from driver.errors import ConfigError

AS_ROOT = os.geteuid() == 0


@pytest.mark.parametrize("where", ["existing", "missing", "missing/deeper"], ids=str)
def test_a_directory_that_is_or_can_be_made_passes_and_nothing_is_made(
    tmp_path: Path, where: str
) -> None:
    directory = tmp_path if where == "existing" else tmp_path / where
    check_writable_directory(directory, flag="--state-dir")
    assert sorted(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ("file", "--state-dir {path} is not a directory"),
        ("file/sub", "--state-dir {path}: Not a directory"),
    ],
    ids=["a-file", "under-a-file"],
)
def test_a_file_where_the_directory_belongs_is_refused(
    tmp_path: Path, layout: str, message: str
) -> None:
    (tmp_path / "file").write_text("x")
    path = tmp_path / layout
    with pytest.raises(ConfigError) as refused:
        check_writable_directory(path, flag="--state-dir")
    assert str(refused.value) == message.format(path=path)


@pytest.mark.skipif(AS_ROOT, reason="root writes into read-only directories")
def test_a_directory_without_write_permission_is_refused(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(ConfigError, match="is not writable"):
        check_writable_directory(locked, flag="--cdi-root")
    with pytest.raises(ConfigError, match=f"cannot be made in {locked}"):
        check_writable_directory(locked / "sub", flag="--cdi-root")


def test_a_file_must_be_a_regular_readable_one(tmp_path: Path) -> None:
    regular = tmp_path / "state.json"
    regular.write_text("{}")
    check_file(regular, flag="--kubeconfig")
    check_file(tmp_path / "absent", flag="--emulated-state-file", may_be_missing=True)
    with pytest.raises(ConfigError, match=r"--kubeconfig .*absent: no such file"):
        check_file(tmp_path / "absent", flag="--kubeconfig")
    with pytest.raises(ConfigError, match=r"--kubeconfig .* is not a regular file"):
        check_file(tmp_path, flag="--kubeconfig")
