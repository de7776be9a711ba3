#!/usr/bin/env bash
# Builds the NetworkPolicy implementation the local cluster's real nodes run: kube-router's
# firewall (github.com/cloudnativelabs/kube-router, the version hack/network-policies/go.mod
# pins, with its vulnerable dependencies raised there), from its Go module, as its own
# Dockerfile builds it (CGO_ENABLED=0 ./cmd/kube-router). Beside the binary, the module's
# generic-kuberouter.yaml, whose ClusterRole the local cluster grants it.
#
# kube-router filters with iptables and ipsets, which every Linux kernel with netfilter has.
# (kube-network-policies, kind's implementation, needs nftables' queue statement, which some
# kernels are built without.)
#
# The directory is keyed by what goes into it (the pin's go.mod and go.sum, the Go version, this
# script); a second run builds nothing and answers at once. The last stdout line is that
# directory.
#
# Environment: KN_RESCHEDULER_CACHE (the cache root, shared with hack/build-bins.sh).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache_root=${KN_RESCHEDULER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kn-rescheduler}
module=github.com/cloudnativelabs/kube-router/v2
VERSION=$(awk '$1 == "require" && $2 == "'"$module"'" {print $3}' "$here/network-policies/go.mod")
[[ -n "$VERSION" ]] || { echo "no $module in hack/network-policies/go.mod" >&2; exit 1; }

log() { printf '[network-policies %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

command -v go >/dev/null || { echo "building kube-router needs go" >&2; exit 1; }
key=$(printf '%s\n' "$(sha256sum <"$0")" "$(go version)" \
  "$(cat "$here/network-policies/go.mod" "$here/network-policies/go.sum" | sha256sum)" |
  sha256sum | cut -c1-16)
out="$cache_root/bins/kube-router-$VERSION-$key"
mkdir -p "$out"

complete() { [[ -x "$out/kube-router" && -s "$out/generic-kuberouter.yaml" ]]; }
if complete; then
  log "kube-router $VERSION: cached"
  echo "$out"
  exit 0
fi
# Two builds at once (a cluster starting beside a test): the second waits, then finds it.
exec 9>"$out/.lock"
flock 9
if complete; then
  log "kube-router $VERSION: built meanwhile"
  echo "$out"
  exit 0
fi

start=$SECONDS
log "kube-router $VERSION: go build (about a minute on 2 cores with a warm Go cache)"
pkg=$module/pkg/version
(cd "$here/network-policies" && CGO_ENABLED=0 go build -trimpath \
  -ldflags "-s -w -X $pkg.Version=$VERSION -X $pkg.BuildDate=1970-01-01T00:00:00Z" \
  -o "$out/kube-router.tmp" "$module/cmd/kube-router")
module_dir=$(cd "$here/network-policies" && go list -m -f '{{.Dir}}' "$module")
install -m 0644 "$module_dir/daemonset/generic-kuberouter.yaml" "$out/generic-kuberouter.yaml"
mv "$out/kube-router.tmp" "$out/kube-router"
log "kube-router: built in $((SECONDS - start)) s"
echo "$out"
