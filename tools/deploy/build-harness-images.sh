#!/usr/bin/env bash
# Builds the rollout images (deploy/harness/*) and makes them available to the cluster.
#
#   tools/deploy/build-harness-images.sh [harness ...]      default: all four
#
# Each image is tagged openforge/harness-<name>:<pinned CLI version> (the harness catalog). Where
# the images go:
#   OPENFORGE_REGISTRY=host:port   push there (e.g. the k3d registry, localhost:5005)
#   otherwise, by the current kube context: kind-<c> -> `kind load`, k3d-<c> -> `k3d image
#   import`; any other context: the images stay in the local Docker engine.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# The images and their tags come from the harness catalog (libs/core/.../harness_catalog.py).
declare -A images=()
while read -r name image; do
  images[${name}]="${image}"
done < <(python3 "${root}/libs/core/src/openforge_core/harness_catalog.py" images)

if [[ $# -gt 0 ]]; then names=("$@"); else names=("${!images[@]}"); fi
context="$(kubectl config current-context 2>/dev/null || true)"

for name in "${names[@]}"; do
  image="${images[$name]:-}"
  if [[ -z "${image}" ]]; then
    echo "unknown harness: ${name} (known: ${!images[*]})" >&2
    exit 2
  fi
  docker build --tag "${image}" "${root}/deploy/harness/${name}"
  if [[ -n "${OPENFORGE_REGISTRY:-}" ]]; then
    docker tag "${image}" "${OPENFORGE_REGISTRY}/${image}"
    docker push "${OPENFORGE_REGISTRY}/${image}"
  elif [[ "${context}" == kind-* ]]; then
    kind load docker-image "${image}" --name "${context#kind-}"
  elif [[ "${context}" == k3d-* ]]; then
    k3d image import "${image}" --cluster "${context#k3d-}"
  else
    echo "${image} built; push it where your cluster can pull it (set OPENFORGE_REGISTRY)." >&2
  fi
done
