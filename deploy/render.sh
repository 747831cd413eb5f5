#!/bin/sh
# Render an InstaSlice overlay with the images (and options) of this build, using only kubectl.
#
#   deploy/render.sh emulated|gpu|scheduler-native|scheduler-native-emulated > manifests.yaml
#
# Environment (all optional; `make deploy` passes them):
#   IMG            controller image         (default quay.io/instaslice/instaslice-controller:latest)
#   IMG_PLUGIN     kubelet-plugin image     (default quay.io/instaslice/instaslice-kubelet-plugin:latest)
#   EMULATED_GPUS  emulated GPUs per node, e.g. 4xH100-80GB (emulated overlays only)
#   COMPONENTS     space-separated names under deploy/components, e.g. "cert-manager"
#   KUBECTL        kubectl command          (default kubectl)
#
# It writes a throw-away kustomization next to the overlays (kustomize refuses absolute paths),
# naming the overlay, the components and kustomize `images:` overrides, renders it with
# `kubectl kustomize` and removes it. Nothing in the repository is modified.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
overlay=${1:-}
kubectl_cmd=${KUBECTL:-kubectl}
img=${IMG:-quay.io/instaslice/instaslice-controller:latest}
img_plugin=${IMG_PLUGIN:-quay.io/instaslice/instaslice-kubelet-plugin:latest}
emulated_gpus=${EMULATED_GPUS:-}
components=${COMPONENTS:-}

die() {
    echo "render.sh: $*" >&2
    exit 2
}

[ -n "$overlay" ] || die "usage: deploy/render.sh <overlay>   (overlays: $(ls "$here/overlays" | tr '\n' ' '))"
[ -f "$here/overlays/$overlay/kustomization.yaml" ] || die "no overlay deploy/overlays/$overlay"
for component in $components; do
    [ -f "$here/components/$component/kustomization.yaml" ] || die "no component deploy/components/$component"
done
case "$emulated_gpus" in
    *[!A-Za-z0-9.,-]*) die "EMULATED_GPUS may hold only letters, digits, '.', ',' and '-': $emulated_gpus" ;;
esac
case "$overlay" in
    emulated | *-emulated) ;;
    *) [ -z "$emulated_gpus" ] || die "EMULATED_GPUS applies to the emulated overlays only" ;;
esac

# image_fields NAME_OR_REF: the kustomize `images:` fields (newName + newTag or digest) of a reference.
image_fields() {
    ref=$1
    case "$ref" in
        *[!A-Za-z0-9./:@_-]*) die "unexpected character in image reference: $ref" ;;
    esac
    case "$ref" in
        *@*)
            echo "  newName: ${ref%%@*}"
            echo "  digest: ${ref#*@}"
            return
            ;;
    esac
    last=${ref##*/}
    case "$last" in
        *:*)
            echo "  newName: ${ref%:*}"
            echo "  newTag: \"${ref##*:}\""
            ;;
        *)
            echo "  newName: $ref"
            echo "  newTag: latest"
            ;;
    esac
}

tmp=$(mktemp -d "$here/.render.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

{
    echo "apiVersion: kustomize.config.k8s.io/v1beta1"
    echo "kind: Kustomization"
    echo "resources:"
    echo "- ../overlays/$overlay"
    if [ -n "$components" ]; then
        echo "components:"
        for component in $components; do
            echo "- ../components/$component"
        done
    fi
    echo "images:"
    echo "- name: quay.io/instaslice/instaslice-controller"
    image_fields "$img"
    echo "- name: quay.io/instaslice/instaslice-kubelet-plugin"
    image_fields "$img_plugin"
    if [ -n "$emulated_gpus" ]; then
        cat <<EOF
patches:
- patch: |-
    apiVersion: apps/v1
    kind: DaemonSet
    metadata:
      name: instaslice-kubelet-plugin
      namespace: instaslice-system
    spec:
      template:
        spec:
          containers:
          - name: kubelet-plugin
            env:
            - name: INSTASLICE_EMULATED_GPUS
              value: "$emulated_gpus"
EOF
    fi
} >"$tmp/kustomization.yaml"

$kubectl_cmd kustomize "$tmp"
