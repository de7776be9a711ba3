#!/usr/bin/env bash
# Builds metrics-server (sigs.k8s.io/metrics-server, cmd/metrics-server), which serves the
# Metrics API (metrics.k8s.io, what `kubectl top` reads) on the local cluster when it is started
# with metrics_server=True, into the same cache as the control plane's binaries, keyed by
# version, so that a second run builds nothing. Prints the path of the binary.
#
# v0.9.0 is the release built against Kubernetes v0.36 libraries (our control plane is v1.36).
# Its go.mod has no replace directive, so `go install ...@VERSION` builds it from its own
# module: no go.mod of ours is needed.
set -euo pipefail

VERSION=${METRICS_SERVER_VERSION:-v0.9.0}
cache_root=${KN_RESCHEDULER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kn-rescheduler}
out="$cache_root/bins/metrics-server-$VERSION"
bin="$out/metrics-server"
mkdir -p "$out"

log() { printf '[metrics-server-bin %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [[ -x "$bin" ]]; then
  log "metrics-server $VERSION: cached"
else
  log "metrics-server $VERSION: building (a few minutes on 2 cores with a cold Go cache)"
  start=$SECONDS
  # The version stamp metrics-server's own Makefile sets (its /version and --version).
  pkg=k8s.io/client-go/pkg/version
  ldflags="-s -w -X $pkg.gitVersion=$VERSION -X $pkg.gitTreeState=clean"
  ldflags+=" -X $pkg.buildDate=1970-01-01T00:00:00Z"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # From a directory outside any module, so that no go.mod or go.work of ours takes part.
  (cd "$tmp" && GOBIN="$tmp/bin" CGO_ENABLED=0 go install -trimpath \
    -ldflags "$ldflags" "sigs.k8s.io/metrics-server/cmd/metrics-server@$VERSION")
  mv "$tmp/bin/metrics-server" "$bin"
  log "metrics-server: built in $((SECONDS - start)) s"
fi

echo "$bin"
