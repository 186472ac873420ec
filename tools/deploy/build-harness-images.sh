#!/usr/bin/env bash
# Builds the rollout images (deploy/harness/*) and makes them available to the cluster.
#
#   tools/deploy/build-harness-images.sh [harness ...]      default: all four
#
# Each image is tagged openforge/harness-<name>:<pinned CLI version>. Where the images go:
#   OPENFORGE_REGISTRY=host:port   push there (e.g. the k3d registry, localhost:5005)
#   otherwise, by the current kube context: kind-<c> -> `kind load`, k3d-<c> -> `k3d image
#   import`; any other context: the images stay in the local Docker engine.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
declare -A versions=(
  [claude-code]=2.1.332
  [codex]=0.171.0
  [openclaw]=2026.9.6
  [mini-swe-agent]=2.4.6
)

if [[ $# -gt 0 ]]; then names=("$@"); else names=(claude-code codex openclaw mini-swe-agent); fi
context="$(kubectl config current-context 2>/dev/null || true)"

for name in "${names[@]}"; do
  version="${versions[$name]:-}"
  if [[ -z "${version}" ]]; then
    echo "unknown harness: ${name} (known: ${!versions[*]})" >&2
    exit 2
  fi
  image="openforge/harness-${name}:${version}"
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
