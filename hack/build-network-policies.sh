#!/usr/bin/env bash
# Builds the NetworkPolicy implementation the local cluster's real nodes run, without a
# container daemon and without any registry on the internet:
#
#   kube-network-policies.oci.tar  registry.k8s.io/networking/kube-network-policies:<v>
#                                  kubernetes-sigs/kube-network-policies at the version
#                                  hack/network-policies/go.mod pins, built from its Go module as
#                                  its own Dockerfile builds it (CGO_ENABLED=0 ./cmd, at
#                                  /bin/netpol), on scratch; named as upstream names it
#                                  (containerd on the real nodes mirrors registry.k8s.io to the
#                                  local registry);
#   kube-network-policies.yaml     the module's own install.yaml (a DaemonSet in kube-system and
#                                  its RBAC), applied by dev/localcluster/networkpolicies.py.
#
# It enforces NetworkPolicies with nftables and an NFQUEUE in each node's network namespace,
# as kindnet does in kind clusters: the policies of knative/ are then refused or let through by
# a real implementation, not assumed.
#
# The archives' directory is keyed by what goes into them (the module's go.mod and go.sum, the
# Go version, this script); a second run builds nothing and answers at once. The last stdout
# line is that directory.
#
# Environment: KN_RESCHEDULER_CACHE (the cache root, shared with hack/build-bins.sh).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache_root=${KN_RESCHEDULER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kn-rescheduler}
module=sigs.k8s.io/kube-network-policies
VERSION=$(awk '$1 == "require" && $2 == "'"$module"'" {print $3}' "$here/network-policies/go.mod")
[[ -n "$VERSION" ]] || { echo "no $module in hack/network-policies/go.mod" >&2; exit 1; }
REF=registry.k8s.io/networking/kube-network-policies:$VERSION

log() { printf '[network-policies %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

missing=()
for tool in buildah go; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if ((${#missing[@]})); then
  echo "building kube-network-policies needs ${missing[*]} (Debian: hack/install-packages.sh" \
    "installs them)" >&2
  exit 1
fi

key=$(printf '%s\n' "$(sha256sum <"$0")" "$(go version)" \
  "$(cat "$here/network-policies/go.mod" "$here/network-policies/go.sum" | sha256sum)" |
  sha256sum | cut -c1-16)
out="$cache_root/network-policies/$VERSION-$key"
mkdir -p "$out"

complete() { [[ -s "$out/kube-network-policies.oci.tar" && -s "$out/kube-network-policies.yaml" ]]; }
if complete; then
  log "$out: cached"
  echo "$out"
  exit 0
fi
# Two builds at once (a cluster starting beside a test): the second waits, then finds them.
exec 9>"$out/.lock"
flock 9
if complete; then
  log "$out: built meanwhile"
  echo "$out"
  exit 0
fi

start=$SECONDS
tmp=$(mktemp -d "${TMPDIR:-/tmp}/knr-network-policies.XXXXXX")
# A storage of its own (vfs: plain copies, no overlay mounts), removed afterwards.
bh=(buildah --root "$tmp/storage" --runroot "$tmp/run" --storage-driver vfs)
cleanup() {
  "${bh[@]}" rm --all >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

log "go build $module/cmd $VERSION (about a minute on 2 cores with a warm Go cache)"
(cd "$here/network-policies" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
  -o "$tmp/netpol" "$module/cmd")
module_dir=$(cd "$here/network-policies" && go list -m -f '{{.Dir}}' "$module")
[[ -f "$module_dir/install.yaml" ]] || { echo "no install.yaml in $module $VERSION" >&2; exit 1; }

ctr=$("${bh[@]}" from --quiet scratch)
"${bh[@]}" copy --quiet --chmod 0755 "$ctr" "$tmp/netpol" /bin/netpol >/dev/null
# The exec form (JSON): there is no shell. Upstream's DaemonSet gives /bin/netpol as its first
# argument and no command, so the image's CMD is what runs without arguments.
"${bh[@]}" config --cmd '["/bin/netpol"]' \
  --label "org.opencontainers.image.version=$VERSION" \
  --label "org.opencontainers.image.source=$module@$VERSION" \
  --created-by "go build $module/cmd ($VERSION)" "$ctr"
# --timestamp 0: the same inputs give the same image digest on every machine.
"${bh[@]}" commit --quiet --rm --format oci --timestamp 0 --identity-label=false \
  "$ctr" "$REF" >/dev/null
"${bh[@]}" push --quiet "$REF" "oci-archive:$out/kube-network-policies.oci.tar.tmp:$REF"
mv "$out/kube-network-policies.oci.tar.tmp" "$out/kube-network-policies.oci.tar"
install -m 0644 "$module_dir/install.yaml" "$out/kube-network-policies.yaml"

log "built in $((SECONDS - start)) s"
echo "$out"
