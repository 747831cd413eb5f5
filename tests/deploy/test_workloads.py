"""The controller Deployment, the kubelet-plugin DaemonSet and the webhook, as rendered: images,
flags (each daemon accepts the whole configuration it is given), host paths, privileges, probes and
the webhook's wiring to its Service."""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Mapping, Sequence

import pytest

from api import names
from controller.settings import parse_settings as controller_settings
from controller.webhook.server import DEFAULT_PATHS
from kubeletplugin.settings import parse_settings as plugin_settings
from tests.deploy import flags
from tests.deploy import manifests as m

CONTROLLER_IMAGE = "quay.io/instaslice/instaslice-controller:latest"
PLUGIN_IMAGE = "quay.io/instaslice/instaslice-kubelet-plugin:latest"
OVERLAYS = ["emulated", "gpu"]
SCHEDULER_OVERLAYS = ["scheduler-native", "scheduler-native-emulated"]

# host path -> the plugin flag (environment variable) that names it
PLUGIN_HOST_PATHS = {
    "/var/lib/kubelet/plugins_registry": "--plugin-registry-dir",
    "/var/lib/kubelet/plugins/mig.instaslice.dev": "--plugin-dir",
    "/var/lib/kubelet/device-plugins": "--device-plugin-dir",
    "/var/lib/kubelet/pod-resources": "--pod-resources-socket",
    "/var/run/cdi": "--cdi-root",
    "/var/lib/instaslice": "--state-dir",
}


def _overlay(name: str) -> list[m.Manifest]:
    return m.render(m.DEPLOY / "overlays" / name)


def _controller(objects: list[m.Manifest]) -> m.Manifest:
    return m.one(objects, "Deployment", "instaslice-controller")


def _plugin(objects: list[m.Manifest]) -> m.Manifest:
    return m.one(objects, "DaemonSet", "instaslice-kubelet-plugin")


def _container(workload: m.Manifest) -> m.Manifest:
    containers: list[m.Manifest] = workload["spec"]["template"]["spec"]["containers"]
    (container,) = containers
    return container


def _env(container: m.Manifest) -> dict[str, m.Manifest]:
    return {e["name"]: e for e in container.get("env", [])}


def _port(container: m.Manifest, name: str) -> int:
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    return int(port)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_images_are_the_published_ones_and_kind_loaded_images_are_used(overlay: str) -> None:
    objects = _overlay(overlay)
    for workload, image in (
        (_controller(objects), CONTROLLER_IMAGE),
        (_plugin(objects), PLUGIN_IMAGE),
    ):
        assert _container(workload)["image"] == image
        assert _container(workload)["imagePullPolicy"] == "IfNotPresent"


@pytest.mark.parametrize(
    ("img", "img_plugin"),
    [
        ("registry.example:5000/me/ctl:v1", "registry.example:5000/me/plugin:v1"),
        ("localhost:5000/ctl", "ghcr.io/x/plugin@sha256:" + "ab" * 32),
    ],
    ids=["tags-and-registry-port", "no-tag-and-digest"],
)
def test_make_deploy_images_replace_the_defaults(img: str, img_plugin: str) -> None:
    objects = m.render_script("gpu", {"IMG": img, "IMG_PLUGIN": img_plugin})
    expected_controller = img if ":" in img.rsplit("/", 1)[-1] else f"{img}:latest"
    assert _container(_controller(objects))["image"] == expected_controller
    assert _container(_plugin(objects))["image"] == img_plugin


def test_render_script_refuses_bad_input() -> None:
    assert m.run_render_script("nope", {}).returncode == 2
    assert m.run_render_script("emulated", {"EMULATED_GPUS": 'x"; rm -rf /'}).returncode == 2
    assert m.run_render_script("gpu", {"EMULATED_GPUS": "2xA100-40GB"}).returncode == 2
    assert m.run_render_script("scheduler-native", {"EMULATED_GPUS": "2xA100-40GB"}).returncode == 2
    assert m.run_render_script("gpu", {"COMPONENTS": "missing"}).returncode == 2


@pytest.mark.parametrize("overlay", [*OVERLAYS, *SCHEDULER_OVERLAYS])
@pytest.mark.parametrize("component", ["controller", "kubelet-plugin"])
def test_configuration_uses_only_real_flags_with_valid_values(overlay: str, component: str) -> None:
    objects = _overlay(overlay)
    workload = _controller(objects) if component == "controller" else _plugin(objects)
    container = _container(workload)
    planned = flags.planned(component)
    assert "command" not in container, "the image's ENTRYPOINT is the console script"
    for arg in container.get("args", []):
        assert arg.split("=", 1)[0] in planned.flags, arg
    for name, entry in _env(container).items():
        if name in flags.FOREIGN_ENV:
            continue
        flag = flags.flag_of_env(name)
        assert flag in planned.flags, f"{name}: no flag {flag} on instaslice-{component}"
        if "value" in entry:
            assert planned.accepts(flag, entry["value"]), f"{name}={entry['value']}"


DOWNWARD_API_SAMPLES = {"metadata.namespace": names.SYSTEM_NAMESPACE, "spec.nodeName": "gpu-node-1"}
"""What the kubelet fills in for a ``fieldRef`` the manifests use."""
PARSE_SETTINGS: Mapping[str, Callable[..., object]] = {
    "controller": controller_settings,
    "kubelet-plugin": plugin_settings,
}
RENDERED: Mapping[str, Callable[[], list[m.Manifest]]] = {
    **{overlay: functools.partial(_overlay, overlay) for overlay in OVERLAYS},
    **{overlay: functools.partial(_overlay, overlay) for overlay in SCHEDULER_OVERLAYS},
    "gpu+cert-manager": lambda: m.render_script("gpu", {"COMPONENTS": "cert-manager"}),
    "emulated+gpus": lambda: m.render_script(
        "emulated", {"EMULATED_GPUS": "1xA100-40GB,1xH100-80GB"}
    ),
}


def _environ(container: m.Manifest) -> dict[str, str]:
    environ = {}
    for name, entry in _env(container).items():
        if "value" in entry:
            environ[name] = str(entry["value"])
        else:
            environ[name] = DOWNWARD_API_SAMPLES[entry["valueFrom"]["fieldRef"]["fieldPath"]]
    return environ


@pytest.mark.parametrize("rendered", sorted(RENDERED))
@pytest.mark.parametrize("component", ["controller", "kubelet-plugin"])
def test_each_daemon_accepts_the_whole_configuration_it_is_given(
    rendered: str, component: str
) -> None:
    """Every flag and env var, checked together as the daemon checks them at start (bounds,
    names, addresses, choices); a refusal here is a pod in a crash loop."""
    objects = RENDERED[rendered]()
    container = _container(_controller(objects) if component == "controller" else _plugin(objects))
    args: Sequence[str] = container.get("args", [])
    PARSE_SETTINGS[component](list(args), environ=_environ(container))


@pytest.mark.parametrize("overlay", [*OVERLAYS, *SCHEDULER_OVERLAYS])
def test_plugin_mounts_exactly_the_six_host_paths_at_the_paths_its_flags_name(overlay: str) -> None:
    plugin = _plugin(_overlay(overlay))
    spec = plugin["spec"]["template"]["spec"]
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert sorted(host_paths.values()) == sorted(PLUGIN_HOST_PATHS)
    assert all("hostPath" in v for v in spec["volumes"])
    container = _container(plugin)
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    assert mounts == host_paths, "each host path is mounted at the same path inside"
    env = _env(container)
    for host_path, flag in PLUGIN_HOST_PATHS.items():
        value = env[flags.env_of_flag(flag)]["value"]
        assert value == host_path or value.startswith(host_path + "/"), flag
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not spec.get(key, False)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_plugin_learns_its_node_name_from_the_downward_api(overlay: str) -> None:
    env = _env(_container(_plugin(_overlay(overlay))))
    node_name = env[flags.env_of_flag("--node-name")]
    assert node_name["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_emulated_plugin_is_unprivileged_on_every_node_with_emulated_gpus() -> None:
    plugin = _plugin(_overlay("emulated"))
    spec = plugin["spec"]["template"]["spec"]
    assert "nodeSelector" not in spec
    assert "runtimeClassName" not in spec
    context = _container(plugin)["securityContext"]
    assert context.get("privileged", False) is False
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"]["drop"] == ["ALL"]
    env = _env(_container(plugin))
    assert env["INSTASLICE_GPU_BACKEND"]["value"] == "emulated"
    assert env["INSTASLICE_EMULATED_GPUS"]["value"] == "2xA100-40GB"


def test_emulated_gpus_can_be_set_at_deploy_time() -> None:
    objects = m.render_script("emulated", {"EMULATED_GPUS": "1xA100-40GB,1xH100-80GB"})
    env = _env(_container(_plugin(objects)))
    assert env["INSTASLICE_EMULATED_GPUS"]["value"] == "1xA100-40GB,1xH100-80GB"


def test_gpu_plugin_is_privileged_only_on_mig_capable_nodes() -> None:
    plugin = _plugin(_overlay("gpu"))
    spec = plugin["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/mig.capable": "true"}
    assert spec["runtimeClassName"] == "nvidia"
    context = _container(plugin)["securityContext"]
    assert context["privileged"] is True
    assert context["readOnlyRootFilesystem"] is True
    env = _env(_container(plugin))
    assert env["INSTASLICE_GPU_BACKEND"]["value"] == "nvml"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_controller_is_two_non_root_replicas_with_leader_election(overlay: str) -> None:
    controller = _controller(_overlay(overlay))
    assert controller["spec"]["replicas"] == 2
    pod = controller["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    container = _container(controller)
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    assert _env(container)["INSTASLICE_LEADER_ELECT"]["value"] == "true"
    assert container["resources"]["requests"]
    assert container["resources"]["limits"]["memory"]


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("component", ["controller", "kubelet-plugin"])
def test_probes_and_ports_match_the_configured_addresses(overlay: str, component: str) -> None:
    objects = _overlay(overlay)
    container = _container(_controller(objects) if component == "controller" else _plugin(objects))
    env = _env(container)
    for flag, port_name in (("--metrics-address", "metrics"), ("--healthz-address", "healthz")):
        address = env[flags.env_of_flag(flag)]["value"]
        assert int(address.rsplit(":", 1)[1]) == _port(container, port_name)
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] == "healthz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # the plugin is ready once the kubelet registered it; the controller once it serves
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


CLAIM_WEBHOOK_PATH = "/mutate-resource-v1-resourceclaim"


def test_webhook_is_wired_to_the_controller_through_its_service() -> None:
    objects = _overlay("gpu")
    controller = _controller(objects)
    container = _container(controller)
    (config,) = m.find(objects, "MutatingWebhookConfiguration")
    env = _env(container)
    assert config["metadata"]["name"] == env["INSTASLICE_WEBHOOK_CONFIG_NAME"]["value"]
    service = m.one(objects, "Service", env["INSTASLICE_WEBHOOK_SERVICE"]["value"])
    assert len(config["webhooks"]) == 3
    for webhook in config["webhooks"]:
        reference = webhook["clientConfig"]["service"]
        assert (reference["name"], reference["namespace"]) == (
            service["metadata"]["name"],
            service["metadata"]["namespace"],
        )
        (service_port,) = service["spec"]["ports"]
        assert reference["port"] == service_port["port"]
        assert service_port["targetPort"] == "webhook"
        assert reference["path"] == (
            CLAIM_WEBHOOK_PATH
            if webhook["name"] == "claim-finalizer.instaslice.dev"
            else getattr(names, "WEBHOOK_PATH", "/mutate-v1-pod")
        )
        assert reference["path"] in DEFAULT_PATHS  # the server answers there
    assert _port(container, "webhook") == int(env["INSTASLICE_WEBHOOK_PORT"]["value"])
    assert service["spec"]["selector"] == controller["spec"]["selector"]["matchLabels"]


def test_webhook_gates_pod_creation_only_and_spares_system_namespaces() -> None:
    (config,) = m.find(_overlay("gpu"), "MutatingWebhookConfiguration")
    policies = {w["name"]: w["failurePolicy"] for w in config["webhooks"]}
    # Classic pods fail closed; claim-bearing pods (any DRA driver's) fail open; so does the claim
    # finalizer (the controller adds it when the webhook did not).
    assert policies == {
        "pod-gate.instaslice.dev": "Fail",
        "claim-gate.instaslice.dev": "Ignore",
        "claim-finalizer.instaslice.dev": "Ignore",
    }
    for webhook in config["webhooks"]:
        (rule,) = webhook["rules"]
        assert (rule["operations"], rule["resources"], rule["apiGroups"]) == (
            (["CREATE"], ["resourceclaims"], ["resource.k8s.io"])
            if webhook["name"] == "claim-finalizer.instaslice.dev"
            else (["CREATE"], ["pods"], [""])
        )
        assert webhook["sideEffects"] == "None"
        assert 1 <= webhook["timeoutSeconds"] <= (10 if webhook["failurePolicy"] == "Fail" else 3)
        (expression,) = webhook["namespaceSelector"]["matchExpressions"]
        assert expression["key"] == "kubernetes.io/metadata.name"
        assert expression["operator"] == "NotIn"
        assert set(expression["values"]) >= {"kube-system", names.SYSTEM_NAMESPACE}


@pytest.mark.parametrize("overlay", SCHEDULER_OVERLAYS)
def test_scheduler_overlays_let_kube_scheduler_allocate_with_no_webhook_and_no_shim(
    overlay: str,
) -> None:
    objects = _overlay(overlay)
    assert m.find(objects, "MutatingWebhookConfiguration") == []
    assert m.find(objects, "Service", "instaslice-webhook") == []
    assert m.find(objects, "PodDisruptionBudget") == []
    plugin_env = _env(_container(_plugin(objects)))
    assert plugin_env["INSTASLICE_CLASSIC_SHIM"]["value"] == "off"
    expected_backend = "emulated" if overlay.endswith("-emulated") else "nvml"
    assert plugin_env["INSTASLICE_GPU_BACKEND"]["value"] == expected_backend
    controller = _controller(objects)
    controller_env = _env(_container(controller))
    assert controller_env["INSTASLICE_ALLOCATION_MODE"]["value"] == "scheduler"
    assert controller_env["INSTASLICE_WEBHOOK_PORT"]["value"] == "0"
    assert controller["spec"]["replicas"] == 1
    classes = m.find(objects, "DeviceClass")
    for device_class in classes:
        name = device_class["metadata"]["name"]
        if name == names.DEVICE_CLASS_ANY:
            assert "extendedResourceName" not in device_class["spec"]
            continue
        profile = name.removeprefix("mig-").removesuffix(names.DEVICE_CLASS_SUFFIX)
        assert device_class["spec"]["extendedResourceName"] == names.classic_resource_name(
            profile
        ), name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_controller_mode_overlays_keep_the_webhook_and_the_shim(overlay: str) -> None:
    objects = _overlay(overlay)
    assert len(m.find(objects, "MutatingWebhookConfiguration")) == 1
    assert "INSTASLICE_CLASSIC_SHIM" not in _env(_container(_plugin(objects)))
    assert "INSTASLICE_ALLOCATION_MODE" not in _env(_container(_controller(objects)))
    assert all("extendedResourceName" not in c["spec"] for c in m.find(objects, "DeviceClass"))


def test_flags_are_read_from_a_parser_with_choices_converters_and_booleans() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-level", choices=["INFO", "DEBUG"], type=str.upper)
    parser.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--state-dir")
    parsed = flags.from_parser(parser, source="test")
    assert parsed.flags == {"--log-level", "--leader-elect", "--no-leader-elect", "--state-dir"}
    assert parsed.accepts("--log-level", "info")
    assert not parsed.accepts("--log-level", "verbose")
    assert parsed.accepts("--leader-elect", "true")
    assert not parsed.accepts("--leader-elect", "yes")
    assert parsed.accepts("--state-dir", "/anything")
