#!/usr/bin/env bash
# Builds the two images the local cluster's real nodes (kubelet + containerd) pull from its local
# registry (dev/localcluster/registry.py), without a container daemon and without any registry
# on the internet:
#
#   pause.oci.tar    kn-rescheduler.local/pause:3.10.2     the pod sandbox: the kubelet's own
#                    build/pause/linux/pause.c from the k8s.io/kubernetes module pinned in
#                    hack/bins/go.mod, linked statically, on scratch, as upstream's
#                    build/pause/Dockerfile and Makefile make it (entrypoint /pause, user 65535);
#   busybox.oci.tar  kn-rescheduler.local/busybox:1.35   the test pods' image: Debian's
#                    statically linked busybox (busybox-static) at /bin/busybox and a symlink for
#                    each of its applets where `busybox --install -s` would put it; cmd sh;
#   coredns.oci.tar  registry.k8s.io/coredns/coredns:<v>  the cluster DNS: CoreDNS at the version
#                    Kubernetes' add-on manifest names, built from its Go module with the plugins
#                    that manifest's Corefile uses (hack/coredns), on scratch, entrypoint
#                    /coredns; named as the manifest names it (containerd on the real nodes
#                    mirrors registry.k8s.io to the local registry), so the manifest is applied
#                    as Kubernetes ships it;
#   coredns.yaml     that manifest (cluster/addons/dns/coredns/coredns.yaml.base of the pinned
#                    k8s.io/kubernetes module), with its placeholders left for the cluster.
#
# The tags are the versions inside (pause.c says v3.10.2 at Kubernetes v1.36.3; Debian
# bookworm's busybox is 1.35); the archives' directory is keyed
# by what goes into them (the Kubernetes version, the busybox, gcc and libc packages, this
# script), and each image carries the exact source version in its org.opencontainers.image.version
# label.
#
# buildah works in a storage of its own under a temporary directory, removed afterwards, so
# nothing is left in /var/lib/containers. Progress goes to stderr; the last stdout line is the
# directory holding the archives. A second run builds nothing and answers at once.
#
# Environment: KN_RESCHEDULER_CACHE (the cache root, shared with hack/build-bins.sh).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache_root=${KN_RESCHEDULER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kn-rescheduler}
PAUSE_REF=kn-rescheduler.local/pause:3.10.2
BUSYBOX_REF=kn-rescheduler.local/busybox:1.35
COREDNS_VERSION=$(awk '$1 == "require" && $2 == "github.com/coredns/coredns" {print $3}' \
  "$here/coredns/go.mod")
COREDNS_REF=registry.k8s.io/coredns/coredns:$COREDNS_VERSION
BUSYBOX_BIN=/bin/busybox

log() { printf '[node-images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# Debian package version, or empty when the package is not installed.
deb_version() {
  dpkg-query -W -f='${Status} ${Version}\n' "$1" 2>/dev/null |
    awk '$1 == "install" && $3 == "installed" {print $4}'
}

missing=()
command -v buildah >/dev/null || missing+=(buildah)
command -v gcc >/dev/null || missing+=(gcc)
command -v go >/dev/null || missing+=(go)
[[ -n "$(deb_version libc6-dev)" ]] || missing+=(libc6-dev)
busybox_version=$(deb_version busybox-static)
# Debian's plain busybox package is dynamically linked and would not run on scratch.
[[ -n "$busybox_version" && -x "$BUSYBOX_BIN" ]] || missing+=(busybox-static)
if ((${#missing[@]})); then
  echo "building the node images needs ${missing[*]} (Debian: hack/install-packages.sh installs" \
    "them)" >&2
  exit 1
fi

K8S_VERSION=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$here/bins/go.mod")
[[ -n "$K8S_VERSION" ]] || { echo "no k8s.io/kubernetes in hack/bins/go.mod" >&2; exit 1; }
# The key: everything that changes the archives' content. Static linking copies libc into pause,
# so the libc version counts as much as the compiler's.
key=$(printf '%s\n' "$K8S_VERSION" "$busybox_version" "$(gcc -dumpfullversion)" \
  "$(deb_version libc6-dev)" "$(sha256sum <"$0")" "$(go version)" \
  "$(cat "$here/coredns/go.mod" "$here/coredns/go.sum" "$here/coredns/main.go" | sha256sum)" |
  sha256sum | cut -c1-16)
out="$cache_root/node-images/$K8S_VERSION-$key"
mkdir -p "$out"

complete() {
  [[ -s "$out/pause.oci.tar" && -s "$out/busybox.oci.tar" && -s "$out/coredns.oci.tar" &&
    -s "$out/coredns.yaml" ]]
}

if complete; then
  log "$out: cached"
  echo "$out"
  exit 0
fi

# Two builds at once (parallel tests, a cluster starting beside them) would share the storage
# and the output names: the second waits, then finds the archives.
exec 9>"$out/.lock"
flock 9
if complete; then
  log "$out: built meanwhile"
  echo "$out"
  exit 0
fi

start=$SECONDS
tmp=$(mktemp -d "${TMPDIR:-/tmp}/knr-node-images.XXXXXX")
# vfs: plain directory copies, no overlay mounts (which fail on an overlay-backed /tmp, as in a
# container, and would have to be unmounted before the directory can go); the layers here are a
# few MB, so copying is free. --root/--runroot keep the images and containers out of
# /var/lib/containers and /run/containers.
bh=(buildah --root "$tmp/storage" --runroot "$tmp/run" --storage-driver vfs)
cleanup() {
  "${bh[@]}" rm --all >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# Writes image $1 (a working container, $2) to the archive $3 under the name $1.
commit_and_push() {
  local ref=$1 ctr=$2 archive=$3
  # --timestamp 0: the same inputs give the same image digest on every machine (the key above).
  "${bh[@]}" commit --quiet --rm --format oci --timestamp 0 --identity-label=false \
    "$ctr" "$ref" >/dev/null
  rm -f "$archive.tmp"
  "${bh[@]}" push --quiet "$ref" "oci-archive:$archive.tmp:$ref"
  mv "$archive.tmp" "$archive"
  log "$(basename "$archive"): $ref, $(du -h "$archive" | cut -f1)"
}

# pause: go mod download fetches the module if the module cache lacks it (the build of the
# control plane's binaries usually has fetched it already) and says where it is.
k8s_dir=$(cd "$here/bins" && go mod download -json k8s.io/kubernetes |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
pause_src="$k8s_dir/build/pause/linux/pause.c"
[[ -f "$pause_src" ]] || { echo "no $pause_src in k8s.io/kubernetes $K8S_VERSION" >&2; exit 1; }
# Upstream's Makefile: TAG for the version the binary prints (`/pause -v`), and its CFLAGS (with
# -static: there is no libc on scratch), then strip. Its REV is the git revision of the
# Kubernetes tree; the module version stands in for it.
pause_tag=$(awk -F' *[?]?= *' '$1 == "TAG" {print $2; exit}' "$k8s_dir/build/pause/Makefile")
log "pause: gcc -static $pause_src (pause.c v$pause_tag)"
mkdir -p "$tmp/pause"
gcc -Os -Wall -Werror -static "-DVERSION=v$pause_tag-$K8S_VERSION" -o "$tmp/pause/pause" \
  "$pause_src"
strip "$tmp/pause/pause"
ctr=$("${bh[@]}" from --quiet scratch)
"${bh[@]}" copy --quiet --chmod 0755 "$ctr" "$tmp/pause/pause" /pause >/dev/null
# The exec form (JSON): buildah turns a plain string into `/bin/sh -c ...`, and there is no shell.
"${bh[@]}" config --entrypoint '["/pause"]' --user 65535:65535 \
  --label "org.opencontainers.image.version=$pause_tag" \
  --label "org.opencontainers.image.source=k8s.io/kubernetes@$K8S_VERSION build/pause" \
  --created-by "gcc -static build/pause/linux/pause.c (k8s.io/kubernetes $K8S_VERSION)" "$ctr"
commit_and_push "$PAUSE_REF" "$ctr" "$out/pause.oci.tar"

# busybox: scratch has no shell to run `busybox --install -s` in, so the tree it would make is
# made here and copied in whole: /bin/busybox and, for every applet at the path busybox lists
# it under (bin/sh, usr/bin/wget, sbin/ifconfig...), a symlink to it. /tmp for what tests write.
log "busybox: $BUSYBOX_BIN (busybox-static $busybox_version)"
tree="$tmp/busybox"
mkdir -p "$tree/bin" "$tree/tmp"
chmod 1777 "$tree/tmp"
cp "$BUSYBOX_BIN" "$tree/bin/busybox"
while read -r applet; do
  # The list names busybox itself too (bin/busybox): a link there would replace the binary.
  [[ -n "$applet" && "$applet" != bin/busybox ]] || continue
  mkdir -p "$tree/$(dirname "$applet")"
  ln -sfn /bin/busybox "$tree/$applet"
done < <("$BUSYBOX_BIN" --list-full)
ctr=$("${bh[@]}" from --quiet scratch)
"${bh[@]}" copy --quiet --chown 0:0 "$ctr" "$tree" / >/dev/null
"${bh[@]}" config --cmd '["sh"]' \
  --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --label "org.opencontainers.image.version=$busybox_version" \
  --label "org.opencontainers.image.source=Debian busybox-static" \
  --created-by "busybox-static $busybox_version with its applets' symlinks" "$ctr"
commit_and_push "$BUSYBOX_REF" "$ctr" "$out/busybox.oci.tar"

# CoreDNS: a static binary (CGO_ENABLED=0), so scratch holds all it needs. Upstream's image runs
# it as a non-root user with a file capability to bind port 53; this one runs as root, and the
# manifest's securityContext drops every capability but NET_BIND_SERVICE all the same.
log "coredns: go build github.com/coredns/coredns $COREDNS_VERSION (hack/coredns)"
mkdir -p "$tmp/coredns"
(cd "$here/coredns" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/coredns/coredns" .)
ctr=$("${bh[@]}" from --quiet scratch)
"${bh[@]}" copy --quiet --chmod 0755 "$ctr" "$tmp/coredns/coredns" /coredns >/dev/null
"${bh[@]}" config --entrypoint '["/coredns"]' --port 53/udp --port 53/tcp --port 9153/tcp \
  --label "org.opencontainers.image.version=$COREDNS_VERSION" \
  --label "org.opencontainers.image.source=github.com/coredns/coredns@$COREDNS_VERSION" \
  --created-by "go build (hack/coredns: CoreDNS $COREDNS_VERSION, the Corefile's plugins)" "$ctr"
commit_and_push "$COREDNS_REF" "$ctr" "$out/coredns.oci.tar"
manifest="$k8s_dir/cluster/addons/dns/coredns/coredns.yaml.base"
[[ -f "$manifest" ]] || { echo "no $manifest in k8s.io/kubernetes $K8S_VERSION" >&2; exit 1; }
grep -q "image: $COREDNS_REF\$" "$manifest" || {
  echo "$manifest names another CoreDNS than hack/coredns/go.mod ($COREDNS_VERSION):" \
    "$(grep 'image:' "$manifest")" >&2
  exit 1
}
install -m 0644 "$manifest" "$out/coredns.yaml"

log "built in $((SECONDS - start)) s"
echo "$out"
