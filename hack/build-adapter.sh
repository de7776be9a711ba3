#!/usr/bin/env bash
# Builds Knative's ApiServerSource receive adapter (cmd/apiserver_receive_adapter of
# knative.dev/eventing, pinned in hack/adapter/go.mod) into a cache keyed by version, so that a
# second run builds nothing. Prints the path of the binary.
#
# Locally it runs outside any cluster against the local kube-apiserver and sends pod events to
# the local router (pipeline/source.py starts it); the events are Knative's own, byte for byte.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
EVENTING_VERSION=$(awk '$1 == "knative.dev/eventing" {print $2}' "$here/adapter/go.mod")
cache_root=${KN_RESCHEDULER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kn-rescheduler}
out="$cache_root/bins/knative-eventing-$EVENTING_VERSION"
bin="$out/apiserver_receive_adapter"
mkdir -p "$out"

log() { printf '[adapter-bin %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [[ -x "$bin" ]]; then
  log "apiserver_receive_adapter $EVENTING_VERSION: cached"
else
  log "apiserver_receive_adapter $EVENTING_VERSION: building (about two minutes on 2 cores)"
  start=$SECONDS
  (cd "$here/adapter" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin.tmp" \
    knative.dev/eventing/cmd/apiserver_receive_adapter)
  mv "$bin.tmp" "$bin"
  log "apiserver_receive_adapter: built in $((SECONDS - start)) s"
fi

echo "$bin"
