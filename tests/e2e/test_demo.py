"""``make demo`` runs to the end, and Ctrl-C stops it cleanly: no process, socket or file left."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from localcluster.demo import build_parser, run_demo

STAGES = ("Pending -> gated", "gated -> placed", "placed -> bound", "bound -> Running")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _root_and_pids(text: str) -> tuple[Path, list[int]]:
    root = re.search(r"all under (\S+)", text)
    assert root is not None, text
    pids = [int(p) for p in re.findall(r"\(pid (\d+)\)", text)]
    return Path(root.group(1)), pids


def test_the_demo_applies_the_samples_shows_them_placed_and_removes_everything() -> None:
    out = io.StringIO()
    args = build_parser().parse_args(["--fast", "--no-color"])
    assert run_demo(args, out=out) == 0, out.getvalue()
    text = out.getvalue()
    assert "\x1b[" not in text
    for stage in STAGES:
        assert stage in text
    assert "pod/cuda-vectoradd created" in text
    assert "resourcequota/mig-slices skipped" in text
    assert "instaslice-demo/cuda-vectoradd" in text
    assert "node-0: 0 MIG instances, 0 CDI specs; node-1: 0 MIG instances, 0 CDI specs" in text
    running_map = text.split("== The slice map with the samples running")[1].split(
        "== kubectl delete"
    )[0]
    assert "| classic |" in running_map
    assert "| dra " in running_map
    assert "MIG-" in running_map
    root, pids = _root_and_pids(text)
    assert len(pids) == 3  # two kubelet plugins and the controller
    assert not root.exists()
    assert not any(_alive(pid) for pid in pids)


def test_ctrl_c_stops_every_process_and_removes_the_temporary_root() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "instaslice.cli", "demo", "--fast", "--no-color"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + 60
    try:
        for line in process.stdout:
            seen.append(line)
            if line.startswith("== Pods on their way") or time.monotonic() > deadline:
                break
        process.send_signal(signal.SIGINT)
        rest, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    text = "".join(seen) + rest
    assert process.returncode == 130, text
    assert "interrupted: stopping everything" in text
    root, pids = _root_and_pids(text)
    assert len(pids) == 3
    assert not root.exists()
    assert not any(_alive(pid) for pid in pids)
