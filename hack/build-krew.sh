#!/usr/bin/env bash
# Builds Krew (sigs.k8s.io/krew, cmd/krew), the version pinned in hack/krew/go.mod, into the
# same cache as the control plane's binaries, keyed by version: a second run builds nothing.
# Prints the path of the binary. The plugin's tests (tests/e2e/test_plugin.py) install the
# plugin with it from a release's Krew manifest and archive.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
VERSION=$(awk '$1 == "sigs.k8s.io/krew" {print $2}' "$here/krew/go.mod")
cache_root=${KN_RESCHEDULER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kn-rescheduler}
out="$cache_root/bins/krew-$VERSION"
bin="$out/krew"
mkdir -p "$out"

log() { printf '[krew-bin %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [[ -x "$bin" ]]; then
  log "krew $VERSION: cached"
else
  log "krew $VERSION: building (under a minute with a cold Go cache)"
  start=$SECONDS
  (cd "$here/krew" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
    -o "$bin.tmp" sigs.k8s.io/krew/cmd/krew)
  mv "$bin.tmp" "$bin"
  log "krew: built in $((SECONDS - start)) s"
fi

echo "$bin"
