#!/usr/bin/env bash
# Create a KinD cluster for InstaSlice, as the seed InstaSlice's deploy/setup.sh did, with two modes:
#
#   deploy/setup.sh                   no GPUs: deploy/kind/cluster.yaml (1 control plane + 2 workers)
#                                     for the emulated overlay (`make deploy-emulated`)
#   deploy/setup.sh --gpu             a GPU host: deploy/kind/cluster-gpu.yaml passes the host GPUs to a
#                                     worker and installs the NVIDIA GPU Operator the way InstaSlice
#                                     needs it (host driver, device plugin OFF, MIG strategy mixed,
#                                     MIG manager in change-only mode); then `make deploy`
#
# Options: --name NAME (default instaslice), --image NODE_IMAGE (default kindest/node:v1.35.0),
#          --cert-manager (also install cert-manager, for COMPONENTS=cert-manager).
# Environment: CONTAINER_TOOL (docker|podman, default docker), KIND, KUBECTL, HELM,
#              GPU_OPERATOR_VERSION (helm chart version; default: latest), CERT_MANAGER_VERSION.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
name=instaslice
image=kindest/node:v1.35.0
gpu=false
cert_manager=false
container_tool=${CONTAINER_TOOL:-docker}
kind_cmd=${KIND:-kind}
kubectl_cmd=${KUBECTL:-kubectl}
helm_cmd=${HELM:-helm}
gpu_operator_version=${GPU_OPERATOR_VERSION:-}
cert_manager_version=${CERT_MANAGER_VERSION:-v1.16.2}

usage() {
    sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}

while [[ $# -gt 0 ]]; do
    case "$1" in
        --gpu | --gpu-operator) gpu=true ;;
        --cert-manager) cert_manager=true ;;
        --name) name=$2; shift ;;
        --image) image=$2; shift ;;
        -h | --help) usage 0 ;;
        *) echo "setup.sh: unknown option $1" >&2; usage 2 ;;
    esac
    shift
done

if [[ "$container_tool" == podman ]]; then
    export KIND_EXPERIMENTAL_PROVIDER=podman
fi

config="$here/kind/cluster.yaml"
if [[ "$gpu" == true ]]; then
    config="$here/kind/cluster-gpu.yaml"
fi

echo ">>> creating KinD cluster $name ($image) from ${config#"$here/../"}"
"$kind_cmd" create cluster --name "$name" --config "$config" --image "$image" --wait 120s
kubectl_ctx=("$kubectl_cmd" --context "kind-$name")

if [[ "$gpu" == true ]]; then
    # The NVIDIA container toolkit inside a KinD node calls /sbin/ldconfig.real (the Debian name).
    for node in $("$kind_cmd" get nodes --name "$name"); do
        "$container_tool" exec "$node" ln -sf /sbin/ldconfig /sbin/ldconfig.real
    done
    echo ">>> installing the NVIDIA GPU Operator (device plugin off, MIG mixed, MIG manager change-only)"
    "$helm_cmd" repo add nvidia https://helm.ngc.nvidia.com/nvidia >/dev/null 2>&1 || true
    "$helm_cmd" repo update nvidia >/dev/null
    version_args=()
    if [[ -n "$gpu_operator_version" ]]; then
        version_args=(--version "$gpu_operator_version")
    fi
    "$helm_cmd" upgrade --install --wait --timeout 15m gpu-operator nvidia/gpu-operator \
        --kube-context "kind-$name" -n gpu-operator --create-namespace ${version_args[@]+"${version_args[@]}"} \
        --set driver.enabled=false \
        --set devicePlugin.enabled=false \
        --set mig.strategy=mixed \
        --set 'migManager.env[0].name=MIG_PARTED_MODE_CHANGE_ONLY' \
        --set-string 'migManager.env[0].value=true'
    echo ">>> GPU nodes (nvidia.com/mig.capable=true):"
    "${kubectl_ctx[@]}" get nodes -l nvidia.com/mig.capable=true
fi

if [[ "$cert_manager" == true ]]; then
    echo ">>> installing cert-manager $cert_manager_version"
    "${kubectl_ctx[@]}" apply -f \
        "https://github.com/cert-manager/cert-manager/releases/download/$cert_manager_version/cert-manager.yaml"
    "${kubectl_ctx[@]}" -n cert-manager rollout status deploy/cert-manager-webhook --timeout=300s
fi

if [[ "$gpu" == true ]]; then
    next="make deploy IMG=... IMG_PLUGIN=...   (gpu overlay)"
else
    next="make deploy-emulated   (after make docker-build and loading the images: see docs/deploy.md)"
fi
echo ">>> cluster kind-$name is ready; next: $next"
