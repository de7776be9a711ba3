#!/usr/bin/env bash
# Builds Helm (helm.sh/helm/v4, cmd/helm), the version pinned in hack/helm/go.mod, into the
# same cache as the control plane's binaries, keyed by version: a second run builds nothing.
# Prints the path of the binary. The chart's tests (tests/e2e/test_chart.py) run it.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
VERSION=$(awk '$1 == "helm.sh/helm/v4" {print $2}' "$here/helm/go.mod")
cache_root=${KN_RESCHEDULER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kn-rescheduler}
out="$cache_root/bins/helm-$VERSION"
bin="$out/helm"
mkdir -p "$out"

log() { printf '[helm-bin %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [[ -x "$bin" ]]; then
  log "helm $VERSION: cached"
else
  log "helm $VERSION: building (a minute or two on 2 cores with a cold Go cache)"
  start=$SECONDS
  # Without the stamp, `helm version` says v4.3 and a chart's kubeVersion check sees no patch.
  ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$VERSION"
  ldflags+=" -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
  (cd "$here/helm" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" \
    -o "$bin.tmp" helm.sh/helm/v4/cmd/helm)
  mv "$bin.tmp" "$bin"
  log "helm: built in $((SECONDS - start)) s"
fi

echo "$bin"
