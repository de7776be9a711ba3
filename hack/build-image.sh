#!/usr/bin/env bash
# Builds the functions' images without a container daemon and without a registry:
#
#   hack/build-image.sh [--out DIR] FUNCTION...     one OCI archive per function: DIR/FUNCTION.tar
#   hack/build-image.sh --base                      only the base image; prints its archive
#
# The base is Debian bookworm's python3.11 in a minimal root filesystem made by mmdebstrap from
# Debian packages (no apt, no docs, no man pages, no locales), with a venv in /opt/venv first on
# PATH: Debian's python3.11 is `python3` and its pip is externally managed (PEP 668), while the
# Dockerfile runs `python` and `pip` as on the stock python image. The base is cached as an OCI
# archive under the cache directory the other build scripts use, keyed by everything that goes
# into it (suite, mirror, packages, dpkg filters, this script's base recipe), so a second build
# reuses it; KNR_BASE_REFRESH=1 rebuilds it (Debian's security updates).
#
# Each function is then the project's Dockerfile built on that base with `buildah bud` (with
# --layers, so the dependency layer is built once for all the functions) and written as an OCI
# archive that `podman load`, `skopeo copy` or a cluster's importer take as is, with its bill of
# materials beside it: DIR/FUNCTION.spdx.json, SPDX 2.3, read from the archive by
# dev/tools/sbom.py (the Debian packages and Python distributions it holds, and its digest).
#
# Reproducible: two builds of one commit are the same images, digest for digest, whatever the
# times of the files in the checkout and whatever buildah's layer cache holds
# (tests/e2e/test_image_reproducible.py builds one with the cache, and again without it from
# another checkout, and compares):
# - every time an image carries (its files', its creation's) is
#   SOURCE_DATE_EPOCH, 0 (1970-01-01) unless set. Not the commit's time: buildah's layer cache
#   does not compare times, so a layer cached at one commit keeps that commit's time at the
#   next, and the digest would depend on what this machine built before;
# - byte code is checked against its source's hash, not its time (the Dockerfile);
# - pip's index and CA bundle reach the build as build secrets, not as build arguments, which
#   buildah writes into the history of the cached layers (an index URL's credentials with it),
#   and which would key them by host;
# - no build history, and base annotations naming the base: both would carry the IDs of the
#   intermediate images the layer cache hands back, which depend on what was built before;
# - the archive is written with its files in name order and fixed times.
# The base is made by mmdebstrap and buildah in their reproducible modes, at a fixed time: the
# same Debian packages make the same base. It is cached, so one machine keeps building on the
# same base; another machine, or a later day, fetches what the mirror has then. To build the
# same base there too, name a snapshot of the archive as the mirror, e.g.
# KNR_DEBIAN_MIRROR=http://snapshot.debian.org/archive/debian/20261101T000000Z.
#
# Environment: KNR_IMAGE_TAG (default dev: the tag, and the version the image reports),
# SOURCE_DATE_EPOCH (default 0), KNR_DEBIAN_MIRROR (default deb.debian.org), KN_RESCHEDULER_CACHE
# (the cache root), KNR_NO_CACHE=1 (build every layer again: what the reproducibility test does).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cache_root=${KN_RESCHEDULER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kn-rescheduler}
tag=${KNR_IMAGE_TAG:-dev}
out="$root/.local/images"
epoch=${SOURCE_DATE_EPOCH:-0}
if ! [[ "$epoch" =~ ^[0-9]+$ ]]; then
  echo "SOURCE_DATE_EPOCH must be seconds since 1970 (got '$epoch')" >&2
  exit 2
fi

log() { printf '[image %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

only_base=""
functions=()
while (($#)); do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --base) only_base=1; shift ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) functions+=("$1"); shift ;;
  esac
done
if [[ -z "$only_base" ]] && ((${#functions[@]} == 0)); then
  echo "usage: $0 [--out DIR] FUNCTION... | --base" >&2
  exit 2
fi

missing=()
for tool in mmdebstrap buildah skopeo; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
  echo "building images needs ${missing[*]} (Debian: hack/install-packages.sh installs them," \
    "or CONTAINER=docker uses a docker daemon instead)" >&2
  exit 1
fi
# buildah and mmdebstrap's root mode need root (or a user namespace with subuids, which
# rootless buildah sets up itself; mmdebstrap then runs in its unshare mode).
if [[ $(id -u) -eq 0 ]]; then mode=root; else mode=unshare; fi

suite=bookworm
mirror=${KNR_DEBIAN_MIRROR:-http://deb.debian.org/debian}
packages=python3.11,python3.11-venv
# dpkg drops these paths while unpacking: documentation, man pages and translations are never
# read in a container. Licences (copyright files) stay.
dpkg_filters=(
  'path-exclude=/usr/share/doc/*'
  'path-include=/usr/share/doc/*/copyright'
  'path-exclude=/usr/share/man/*'
  'path-exclude=/usr/share/info/*'
  'path-exclude=/usr/share/locale/*'
  'path-include=/usr/share/locale/locale.alias'
  'path-exclude=/usr/share/lintian/*'
)
venv=/opt/venv
# The base's time, fixed: not SOURCE_DATE_EPOCH, which would make a new base for every value.
base_epoch=0
base_path="$venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The cache key: everything above that changes the base's content.
key=$(printf '%s\n' "$suite" "$mirror" "$packages" "${dpkg_filters[@]}" "$venv" "$base_epoch" \
  "$base_path" "$(sed -n '/^# base recipe: begin/,/^# base recipe: end/p' "$0")" | sha256sum | cut -c1-16)
base_dir="$cache_root/images/base-$key"
base_archive="$base_dir/base.tar"
base_ref="localhost/kn-rescheduler/python-base:$key"

# base recipe: begin
build_base() {
  local tmp="$base_dir/.build"
  rm -rf "$tmp" && mkdir -p "$tmp"
  local dpkgopts=()
  for f in "${dpkg_filters[@]}"; do dpkgopts+=(--dpkgopt="$f"); done
  log "base: mmdebstrap $suite with $packages (about a minute)"
  # essential: only the Essential:yes packages plus what python3.11 depends on; no apt, since
  # nothing installs Debian packages into the image afterwards. The merged-usr hook makes the
  # /usr symlinks itself and installs usr-is-merged (mmdebstrap's manual): otherwise bookworm's
  # init-system-helpers pulls in usrmerge and, through it, 50 MB of perl. The venv is made in
  # the target by the target's own python (pip and setuptools wheels from python3.11-venv).
  # SOURCE_DATE_EPOCH: mmdebstrap clamps every file's time to it and drops its logs and caches;
  # set, it also makes py_compile (Debian's py3compile, ensurepip) write byte code checked
  # against the source's hash, which the clamped times cannot make stale. resolv.conf and
  # hostname would be the host's copies: fixed contents instead, as hosts is. A container
  # runtime mounts its own over all three, and buildah's RUN steps too; were they missing, each
  # step would leave empty files in its layer where it mounted them.
  SOURCE_DATE_EPOCH=$base_epoch mmdebstrap --mode="$mode" --variant=essential \
    --include="$packages" "${dpkgopts[@]}" \
    --aptopt='APT::Install-Recommends "false"' \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --customize-hook="chroot \"\$1\" python3.11 -m venv $venv" \
    --customize-hook='rm -rf "$1"/var/cache/* "$1"/var/lib/apt/lists/* "$1"/var/log/*' \
    --customize-hook=': >"$1"/etc/resolv.conf; echo localhost >"$1"/etc/hostname' \
    --customize-hook='printf "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n" >"$1"/etc/hosts' \
    --quiet "$suite" "$tmp/rootfs.tar" "$mirror"
  log "base: rootfs $(du -h "$tmp/rootfs.tar" | cut -f1), to an OCI image"
  local ctr
  ctr=$(buildah from scratch)
  # shellcheck disable=SC2064 # the container's name now, not when the trap runs
  trap "buildah rm $ctr >/dev/null 2>&1 || true" EXIT
  buildah add --quiet "$ctr" "$tmp/rootfs.tar" / >/dev/null
  buildah config --env PATH="$base_path" --env VIRTUAL_ENV="$venv" --env LANG=C.UTF-8 \
    --cmd python3 --created-by "mmdebstrap $suite $packages" "$ctr"
  buildah commit --quiet --rm --format oci --timestamp "$base_epoch" "$ctr" \
    "oci-archive:$tmp/base.tar:$base_ref" >/dev/null
  trap - EXIT
  mv "$tmp/base.tar" "$base_archive"
  rm -rf "$tmp"
}
# base recipe: end

mkdir -p "$base_dir"
if [[ -n "${KNR_BASE_REFRESH:-}" ]]; then rm -f "$base_archive"; fi
built_base=""
if [[ -s "$base_archive" ]]; then
  log "base $key: cached"
else
  start=$SECONDS
  build_base
  built_base=1
  log "base $key: built in $((SECONDS - start)) s"
fi
if [[ -n "$only_base" ]]; then
  echo "$base_archive"
  exit 0
fi

# buildah bud takes its base from local storage: the cached archive is loaded there once, and
# again when it was just rebuilt (the new image takes the tag over).
if [[ -n "$built_base" ]] || ! buildah inspect --type image "$base_ref" >/dev/null 2>&1; then
  skopeo copy --quiet "oci-archive:$base_archive" "containers-storage:$base_ref"
fi
# The base's manifest digest, for the images' base annotations (below).
base_digest=$(tar -xOf "$base_archive" index.json | grep -o '"digest":"sha256:[0-9a-f]*"' |
  head -n 1 | cut -d'"' -f4)

# pip in the build trusts what the host trusts: on a host behind a TLS-intercepting proxy the
# index's certificate is signed by a CA only the host's bundle holds. The bundle and the index
# (the host's choice, else pip's default) are given to pip as the Dockerfile's build secrets:
# neither ends up in a layer or in the image's history.
build_tmp=$(mktemp -d)
trap 'rm -rf "$build_tmp"' EXIT
host_ca=${PIP_CERT:-${REQUESTS_CA_BUNDLE:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}}
pip_args=(--secret "id=pipconf,src=$build_tmp/pip.conf")
{
  echo "[global]"
  echo "index-url = ${PIP_INDEX_URL:-https://pypi.org/simple}"
  if [[ -f "$host_ca" ]]; then
    echo "cert = /run/knr-build-ca.crt"
    pip_args+=(--secret "id=pipca,src=$host_ca")
  fi
} >"$build_tmp/pip.conf"
cache_args=()
if [[ -n "${KNR_NO_CACHE:-}" ]]; then cache_args+=(--no-cache); fi

# The bill of materials needs only Python's standard library: the project's venv, else the
# host's python3 (3.11 or newer).
python=${PYTHON:-$root/.venv/bin/python}
[[ -x "$python" ]] || python=python3
write_sbom() {
  PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" "$python" -m dev.tools.sbom "$1" >/dev/null
}

mkdir -p "$out"
for fn in "${functions[@]}"; do
  [[ -f "$root/functions/$fn/main.py" ]] || { echo "no function $fn" >&2; exit 2; }
  start=$SECONDS
  image="localhost/kn-rescheduler/$fn:$tag"
  # --isolation chroot: the Dockerfile's RUN steps need no OCI runtime, so no cgroups (crun
  # refuses a hybrid cgroup v1/v2 host) and no user namespace setup. --network host: pip reaches
  # the package index the way the host does, with no container network to set up. --layers:
  # the requirements layer is built once and shared by all the functions.
  # The version is given twice: as the Dockerfile's build argument (docker builds) and as the
  # label and variable it sets. buildah 1.28's layer cache does not tell a LABEL or ENV step
  # from the same step with another ARG value, and would hand a new tag the previous tag's
  # image; the flags are applied to the final image and make it tag-specific.
  # --timestamp: the time of every file in the new layers and of the image. A cached build
  # and an uncached one of the same commit must not differ either, and buildah's layer cache
  # hands back intermediate images made by earlier builds, whose IDs depend on what those were
  # (the version flags below are in their configs). Those IDs reach the image twice: in its
  # history (each step names its intermediate: --omit-history), and in the manifest's base
  # annotations, which a cached build points at an intermediate (set here: the base itself).
  buildah bud --quiet --layers "${cache_args[@]}" --force-rm --pull=never --isolation chroot \
    --network host --format oci --timestamp "$epoch" --omit-history \
    --annotation org.opencontainers.image.base.name="$base_ref" \
    --annotation org.opencontainers.image.base.digest="$base_digest" \
    --build-arg PYTHON_IMAGE="$base_ref" --build-arg FUNCTION="$fn" --build-arg VERSION="$tag" \
    --label org.opencontainers.image.version="$tag" --env KN_RESCHEDULER_VERSION="$tag" \
    "${pip_args[@]}" \
    -t "$image" -f "$root/Dockerfile" "$root" >/dev/null
  # Writing the archive (compressing every layer) is most of a warm build: skipped when the
  # archive already holds this very image under this tag.
  id=$(buildah inspect --type image --format '{{.FromImageID}}' "$image")
  if [[ -s "$out/$fn.tar" ]] && [[ "$(cat "$out/$fn.id" 2>/dev/null)" == "$id $tag" ]]; then
    [[ -s "$out/$fn.spdx.json" ]] || write_sbom "$out/$fn.tar"
    log "$fn: $out/$fn.tar unchanged ($((SECONDS - start)) s)"
    continue
  fi
  rm -f "$out/$fn.tar" "$out/$fn.id" "$out/$fn.spdx.json"
  # An OCI layout first, then its tar with the files in name order and fixed times and owners:
  # buildah's own oci-archive stamps each file with the time it was written.
  rm -rf "$build_tmp/layout"
  buildah push --quiet "$image" "oci:$build_tmp/layout:kn-rescheduler/$fn:$tag"
  tar --create --file "$out/$fn.tar.partial" --directory "$build_tmp/layout" --sort=name \
    --mtime="@$epoch" --owner=0 --group=0 --numeric-owner --mode='a+rX,u+w,go-w' --format=gnu \
    oci-layout index.json blobs
  mv "$out/$fn.tar.partial" "$out/$fn.tar"
  rm -rf "$build_tmp/layout"
  write_sbom "$out/$fn.tar"
  echo "$id $tag" >"$out/$fn.id"
  log "$fn: $out/$fn.tar ($(du -h "$out/$fn.tar" | cut -f1)) and $fn.spdx.json in $((SECONDS - start)) s"
done
