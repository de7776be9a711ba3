#!/usr/bin/env bash
# Builds Knative Eventing's data plane from its Go module (knative.dev/eventing, pinned in
# hack/adapter/go.mod) into a cache keyed by version, so that a second run builds nothing:
#
#   apiserver_receive_adapter   the ApiServerSource's receive adapter (pod events)
#   ingress, filter             the multi-tenant channel-based Broker's ingress and filter
#   channel_dispatcher          the in-memory channel's dispatcher (the Broker's fan-out)
#
# and copies, from the same module, the CRDs, ConfigMaps and data plane roles they were built
# against (config/core/resources, config/channels/in-memory-channel/resources,
# config/core/configmaps; the broker filter's and ingress's roles and the channel dispatcher's)
# to config/ beside them. Locally they run as processes against the local kube-apiserver
# (dev/pipeline/broker.py, dev/pipeline/source.py). Prints the directory.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
EVENTING_VERSION=$(awk '$1 == "knative.dev/eventing" {print $2}' "$here/adapter/go.mod")
cache_root=${KN_RESCHEDULER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kn-rescheduler}
out="$cache_root/bins/knative-eventing-$EVENTING_VERSION"
mkdir -p "$out"

log() { printf '[knative-bins %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

declare -A packages=(
  [apiserver_receive_adapter]=knative.dev/eventing/cmd/apiserver_receive_adapter
  [ingress]=knative.dev/eventing/cmd/broker/ingress
  [filter]=knative.dev/eventing/cmd/broker/filter
  [channel_dispatcher]=knative.dev/eventing/cmd/in_memory/channel_dispatcher
)
missing=()
for name in "${!packages[@]}"; do
  [[ -x "$out/$name" ]] || missing+=("$name")
done

if ((${#missing[@]} == 0)); then
  log "knative eventing $EVENTING_VERSION: cached"
else
  log "knative eventing $EVENTING_VERSION: building ${missing[*]} (a few minutes on 2 cores)"
  start=$SECONDS
  tmp="$out/.build"
  rm -rf "$tmp" && mkdir -p "$tmp"
  pkgs=()
  for name in "${missing[@]}"; do pkgs+=("${packages[$name]}"); done
  # One go build for all of them: the shared dependencies compile once.
  (cd "$here/adapter" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/" "${pkgs[@]}")
  for name in "${missing[@]}"; do
    built="$tmp/$(basename "${packages[$name]}")"
    mv "$built" "$out/$name"
  done
  rm -rf "$tmp"
  log "built in $((SECONDS - start)) s"
fi

if [[ ! -f "$out/config/.complete-v2" ]]; then
  module=$(cd "$here/adapter" && go list -m -f '{{.Dir}}' knative.dev/eventing)
  rm -rf "$out/config" && mkdir -p "$out/config/crds" "$out/config/configmaps" "$out/config/roles"
  cp "$module"/config/core/resources/*.yaml "$module"/config/channels/in-memory-channel/resources/*.yaml \
    "$out/config/crds/"
  cp "$module"/config/core/configmaps/*.yaml "$out/config/configmaps/"
  # What each data plane binary's ServiceAccount is bound to in a cluster.
  cp "$module"/config/brokers/mt-channel-broker/roles/{filter,ingress}-{clusterrole,role}.yaml \
    "$module"/config/channels/in-memory-channel/roles/dispatcher-clusterrole.yaml \
    "$module"/config/channels/in-memory-channel/200-imc-dispatcher-serviceaccount.yaml \
    "$out/config/roles/"
  chmod -R u+w "$out/config"
  touch "$out/config/.complete-v2"
  log "CRDs, ConfigMaps and roles of $EVENTING_VERSION copied"
fi

echo "$out"
