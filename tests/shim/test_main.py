"""The console script serves the shim: a real plugin process registers with a (fake) kubelet, serves a
classic pod, and removes its device-plugin sockets on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from tests.shim.harness import R_1G, ShimNode, wait_for


def test_plugin_process_registers_every_profile_and_serves_a_classic_pod(node: ShimNode) -> None:
    harness = node.node
    env = {
        **os.environ,
        "NODE_NAME": harness.node,
        "INSTASLICE_GPU_BACKEND": "emulated",
        "INSTASLICE_EMULATED_GPUS": harness.gpus,
    }
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kubeletplugin",
            "--kube-api-url",
            node.apiserver.url,
            "--plugin-registry-dir",
            str(harness.registry_dir),
            "--plugin-dir",
            str(harness.plugin_dir),
            "--device-plugin-dir",
            str(node.device_plugin_dir),
            "--pod-resources-socket",
            str(node.pod_resources_socket),
            "--cdi-root",
            str(harness.cdi_root),
            "--state-dir",
            str(harness.state_dir),
            "--emulated-state-file",
            str(harness.emulated_state),
            "--metrics-address",
            "",
            "--healthz-address",
            "",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: process.poll() is None and len(node.kubelet.plugins) == 7, timeout=30)
        node.kubelet.wait_devices(R_1G, 14)
        reserved = node.reserve([("main", "1g.5gb", [["gpu-0-1g-5gb-6"]])])
        admitted = node.kubelet.admit(reserved.pod)
        assert len(admitted.answers[("main", R_1G)].cdi_devices) == 1
        assert node.instances() == [(0, "1g.5gb", 6)]

        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 0, stderr
        assert sorted(p.name for p in node.device_plugin_dir.iterdir()) == ["kubelet.sock"]
        assert node.instances() == [(0, "1g.5gb", 6)]  # a stop keeps prepared slices
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
