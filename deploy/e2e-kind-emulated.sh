#!/usr/bin/env bash
# End-to-end on KinD without GPUs, as the seed InstaSlice's `make test-e2e-kind-emulated` did:
# create the cluster (deploy/kind/cluster.yaml), load the images built by `make docker-build`,
# deploy the emulated overlay, apply samples/, wait until every sample pod runs, and check that
# InstaSlice placed them (no gate left, every claim allocated by our driver, three slices visible
# to the three-slice pod). `make cleanup-test-e2e-kind-emulated` deletes the cluster.
#
# Environment (the Makefile passes them): KIND_CLUSTER, KIND_NODE_IMAGE, IMG, IMG_PLUGIN,
# CONTAINER_TOOL, KIND, KUBECTL, E2E_TIMEOUT (seconds per wait, default 300).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cluster=${KIND_CLUSTER:-instaslice}
node_image=${KIND_NODE_IMAGE:-kindest/node:v1.35.0}
img=${IMG:-quay.io/instaslice/instaslice-controller:latest}
img_plugin=${IMG_PLUGIN:-quay.io/instaslice/instaslice-kubelet-plugin:latest}
container_tool=${CONTAINER_TOOL:-docker}
kind_cmd=${KIND:-kind}
timeout=${E2E_TIMEOUT:-300}
driver=mig.instaslice.dev
demo_namespaces=(instaslice-demo instaslice-quota-demo)

if [[ "$container_tool" == podman ]]; then
    export KIND_EXPERIMENTAL_PROVIDER=podman
fi
k() { ${KUBECTL:-kubectl} --context "kind-$cluster" "$@"; }
step() { printf '\n>>> %s\n' "$*"; }
fail() {
    printf '\nFAILED: %s\n' "$*" >&2
    k get pods -A -o wide >&2 || true
    k -n instaslice-system logs -l app.kubernetes.io/component=controller --tail=50 >&2 || true
    exit 1
}
# until_true SECONDS DESCRIPTION COMMAND...: retry COMMAND every 2 s until it succeeds.
until_true() {
    local seconds=$1 what=$2
    shift 2
    local deadline=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || fail "timed out after ${seconds}s waiting for $what"
        sleep 2
    done
}

step "KinD cluster $cluster ($node_image)"
if "$kind_cmd" get clusters 2>/dev/null | grep -qx "$cluster"; then
    echo "reusing the existing cluster"
else
    "$kind_cmd" create cluster --name "$cluster" --config "$repo/deploy/kind/cluster.yaml" \
        --image "$node_image" --wait 120s
fi

step "loading $img and $img_plugin"
archives=$(mktemp -d)
trap 'rm -rf "$archives"' EXIT
"$container_tool" save -o "$archives/controller.tar" "$img"
"$container_tool" save -o "$archives/kubelet-plugin.tar" "$img_plugin"
"$kind_cmd" load image-archive "$archives/controller.tar" --name "$cluster"
"$kind_cmd" load image-archive "$archives/kubelet-plugin.tar" --name "$cluster"

step "deploying the emulated overlay"
IMG=$img IMG_PLUGIN=$img_plugin KUBECTL="${KUBECTL:-kubectl}" "$repo/deploy/render.sh" emulated |
    k apply -f -
k -n instaslice-system rollout status deploy/instaslice-controller --timeout="${timeout}s" ||
    fail "controller not available"
k -n instaslice-system rollout status ds/instaslice-kubelet-plugin --timeout="${timeout}s" ||
    fail "kubelet plugin not running on every node"

workers=$(k get nodes -l '!node-role.kubernetes.io/control-plane' -o name | wc -l)
pools_published() {
    local pools
    pools=$(k get resourceslices --field-selector "spec.driver=$driver" \
        -o jsonpath='{range .items[*]}{.spec.pool.name}{"\n"}{end}' | sort -u | grep -c .)
    [[ "$pools" -ge "$workers" ]]
}
until_true "$timeout" "ResourceSlices of $driver from $workers nodes" pools_published
k get resourceslices --field-selector "spec.driver=$driver"

step "applying samples/"
k apply -f "$repo/samples/namespace.yaml"
for namespace in "${demo_namespaces[@]}"; do
    # Pods are refused until the namespace's default ServiceAccount exists.
    until_true 60 "ServiceAccount $namespace/default" k -n "$namespace" get serviceaccount default
done
k apply -k "$repo/samples"

step "waiting for the sample workloads"
for namespace in "${demo_namespaces[@]}"; do
    for workload in $(k -n "$namespace" get deployments,statefulsets -o name); do
        k -n "$namespace" rollout status "$workload" --timeout="${timeout}s" ||
            fail "$namespace/$workload not ready"
    done
    k -n "$namespace" wait pod --for=condition=Ready --timeout="${timeout}s" \
        -l 'app.kubernetes.io/part-of=instaslice-samples,!batch.kubernetes.io/job-name' ||
        fail "sample pods in $namespace not Ready"
done
k -n instaslice-demo wait job/mig-job --for=condition=Complete --timeout="${timeout}s" ||
    fail "job mig-job did not complete"

step "checking what InstaSlice did"
for namespace in "${demo_namespaces[@]}"; do
    gated=$(k -n "$namespace" get pods \
        -o jsonpath='{range .items[?(@.spec.schedulingGates)]}{.metadata.name}{" "}{end}')
    [[ -z "$gated" ]] || fail "pods still gated in $namespace: $gated"
    claims=$(k -n "$namespace" get resourceclaims \
        -o jsonpath='{range .items[*]}{.metadata.name}{"="}{.status.allocation.devices.results[*].driver}{"\n"}{end}')
    echo "$claims"
    while IFS='=' read -r claim drivers; do
        [[ -z "$claim" ]] && continue
        [[ -n "$drivers" ]] || continue # a finished Job pod's claim, already released
        for d in $drivers; do
            [[ "$d" == "$driver" ]] || fail "claim $namespace/$claim allocated by $d"
        done
    done <<<"$claims"
done
visible=$(k -n instaslice-demo logs three-slices | sed -n 's/^NVIDIA_VISIBLE_DEVICES=//p')
[[ $(tr ',' '\n' <<<"$visible" | grep -c .) -eq 3 ]] ||
    fail "three-slices sees '$visible', expected three MIG UUIDs"
k get pods -n instaslice-demo -o wide
k get pods -n instaslice-quota-demo -o wide
printf '\nPASSED: every sample placed by InstaSlice on cluster kind-%s\n' "$cluster"
