#!/usr/bin/env bash
# Builds the descheduler (sigs.k8s.io/descheduler, cmd/descheduler) that the benchmarks run as
# a peer of kn-rescheduler, into the same cache as the control plane's binaries, keyed by
# version, so that a second run builds nothing. Prints the path of the binary.
#
# The version is pinned in hack/descheduler/go.mod. `go install ...@VERSION` cannot build it:
# the descheduler's own go.mod carries a replace directive, which go install refuses, so it is
# built from our small module that repeats that replace.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
VERSION=$(awk '$1 == "require" && $2 == "sigs.k8s.io/descheduler" {print $3}' "$here/descheduler/go.mod")
cache_root=${KN_RESCHEDULER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kn-rescheduler}
out="$cache_root/bins/descheduler-$VERSION"
bin="$out/descheduler"
mkdir -p "$out"

log() { printf '[descheduler-bin %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [[ -x "$bin" ]]; then
  log "descheduler $VERSION: cached"
else
  log "descheduler $VERSION: building (a few minutes on 2 cores with a cold Go cache)"
  start=$SECONDS
  pkg=sigs.k8s.io/descheduler/pkg/version
  ldflags="-s -w -X $pkg.version=$VERSION -X $pkg.buildDate=1970-01-01T00:00:00Z"
  (cd "$here/descheduler" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" \
    -o "$bin.tmp" sigs.k8s.io/descheduler/cmd/descheduler)
  mv "$bin.tmp" "$bin"
  log "descheduler: built in $((SECONDS - start)) s"
fi

echo "$bin"
