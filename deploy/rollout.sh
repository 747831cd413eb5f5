#!/bin/sh
# Wait until InstaSlice is rolled out (`make deploy` runs it after `kubectl apply`), and say why not
# as soon as it is clear that it will not be:
#   - a container of the images just deployed cannot start: its image cannot be pulled
#     (ErrImagePull, ImagePullBackOff, InvalidImageName), it keeps crashing (CrashLoopBackOff) or
#     cannot be created;
#   - a kubelet-plugin pod of this image is not ready and posted a Warning event on its Node since
#     it started (a node it cannot serve: no kubelet where its host paths point, no GPU backend).
# Otherwise it waits for `kubectl rollout status` of the controller Deployment and the plugin
# DaemonSet, up to TIMEOUT seconds. Pods of an earlier rollout are ignored (they are going away).
#
#   deploy/rollout.sh            (KUBECTL, TIMEOUT=300, NAMESPACE=instaslice-system)
set -eu

kubectl_cmd=${KUBECTL:-kubectl}
namespace=${NAMESPACE:-instaslice-system}
timeout=${TIMEOUT:-300}
tab=$(printf '\t')

k() { $kubectl_cmd -n "$namespace" "$@"; }
fail() {
    echo "rollout: $*" >&2
    exit 1
}

# The runtime reports docker.io images by their full name ("busybox:1.36" runs as
# "docker.io/library/busybox:1.36"): compare names without that prefix.
NORMALIZE='function norm(s) { sub(/^docker\.io\/library\//, "", s); sub(/^docker\.io\//, "", s); return s }'

image_of() { # image_of KIND/NAME: the image its pod template names (empty if absent)
    k get "$1" -o jsonpath='{.spec.template.spec.containers[0].image}' 2>/dev/null || true
}

# container <tab> image <tab> reason <tab> message, for containers of IMAGES (the ones deployed)
# waiting for a reason that waiting will not cure.
stuck_containers() {
    k get pods -l app.kubernetes.io/name=instaslice \
        -o jsonpath='{range .items[*]}{range .status.containerStatuses[*]}{.name}{"\t"}{.image}{"\t"}{.state.waiting.reason}{"\t"}{.state.waiting.message}{"\n"}{end}{end}' |
        awk -F'\t' -v a="$1" -v b="$2" "$NORMALIZE"'
            (norm($2) == norm(a) || norm($2) == norm(b)) &&
            $3 ~ /^(ErrImagePull|ImagePullBackOff|InvalidImageName|CrashLoopBackOff|CreateContainerConfigError|CreateContainerError|RunContainerError)$/'
}

# node <tab> reason <tab> message of Warnings the plugin posted on a Node after a not-ready plugin
# pod of IMAGE started there (RFC 3339 UTC times compare as text).
plugin_warnings() {
    {
        k get pods -l app.kubernetes.io/component=kubelet-plugin \
            -o jsonpath='{range .items[*]}pod{"\t"}{.spec.nodeName}{"\t"}{.status.startTime}{"\t"}{.status.containerStatuses[0].ready}{"\t"}{.spec.containers[0].image}{"\n"}{end}'
        $kubectl_cmd get events -A \
            --field-selector "involvedObject.kind=Node,type=Warning,source=instaslice-kubelet-plugin" \
            -o jsonpath='{range .items[*]}event{"\t"}{.involvedObject.name}{"\t"}{.lastTimestamp}{"\t"}{.reason}{"\t"}{.message}{"\n"}{end}'
    } | awk -F'\t' -v image="$1" "$NORMALIZE"'
        $1 == "pod" && $4 != "true" && norm($5) == norm(image) && $3 != "" { started[$2] = $3 }
        $1 == "event" { events[++n] = $0 }
        END {
            for (i = 1; i <= n; i++) {
                split(events[i], e, "\t")
                if ((e[2] in started) && e[3] >= started[e[2]]) print e[2] "\t" e[4] "\t" e[5]
            }
        }'
}

rolled_out() { # rolled_out KIND/NAME: done (or absent from this overlay)
    k get "$1" >/dev/null 2>&1 || return 0
    k rollout status "$1" --timeout=1s >/dev/null 2>&1
}

controller_image=$(image_of deployment/instaslice-controller)
plugin_image=$(image_of daemonset/instaslice-kubelet-plugin)
deadline=$(($(date +%s) + timeout))
while :; do
    if rolled_out deployment/instaslice-controller && rolled_out daemonset/instaslice-kubelet-plugin; then
        for workload in deployment/instaslice-controller daemonset/instaslice-kubelet-plugin; do
            if k get "$workload" >/dev/null 2>&1; then k rollout status "$workload"; fi
        done
        exit 0
    fi
    stuck=$(stuck_containers "$controller_image" "$plugin_image")
    if [ -n "$stuck" ]; then
        echo "$stuck" | sort -u | while IFS="$tab" read -r container image reason message; do
            echo "rollout: container $container ($image): $reason: $message" >&2
        done
        fail "InstaSlice cannot start (see above); \`kubectl -n $namespace describe pods\` for the events"
    fi
    warnings=$(plugin_warnings "$plugin_image")
    if [ -n "$warnings" ]; then
        echo "$warnings" | sort -u | while IFS="$tab" read -r node reason message; do
            echo "rollout: node $node: $reason: $message" >&2
        done
        fail "the kubelet plugin cannot serve these nodes; it retries with back-off (\`kubectl describe node\`)"
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
        k get pods -o wide >&2 || true
        fail "not rolled out after ${timeout}s"
    fi
    sleep 2
done
