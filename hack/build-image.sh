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
# archive that `podman load`, `skopeo copy` or a cluster's importer take as is.
#
# Environment: KNR_IMAGE_TAG (default dev: the tag, and the version the image reports), KNR_DEBIAN_MIRROR (default deb.debian.org),
# KN_RESCHEDULER_CACHE (the cache root).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cache_root=${KN_RESCHEDULER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kn-rescheduler}
tag=${KNR_IMAGE_TAG:-dev}
out="$root/.local/images"

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
base_path="$venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The cache key: everything above that changes the base's content.
key=$(printf '%s\n' "$suite" "$mirror" "$packages" "${dpkg_filters[@]}" "$venv" "$base_path" \
  "$(sed -n '/^# base recipe: begin/,/^# base recipe: end/p' "$0")" | sha256sum | cut -c1-16)
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
  mmdebstrap --mode="$mode" --variant=essential --include="$packages" "${dpkgopts[@]}" \
    --aptopt='APT::Install-Recommends "false"' \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --customize-hook="chroot \"\$1\" python3.11 -m venv $venv" \
    --customize-hook='rm -rf "$1"/var/cache/* "$1"/var/lib/apt/lists/* "$1"/var/log/*' \
    --quiet "$suite" "$tmp/rootfs.tar" "$mirror"
  log "base: rootfs $(du -h "$tmp/rootfs.tar" | cut -f1), to an OCI image"
  local ctr
  ctr=$(buildah from scratch)
  # shellcheck disable=SC2064 # the container's name now, not when the trap runs
  trap "buildah rm $ctr >/dev/null 2>&1 || true" EXIT
  buildah add --quiet "$ctr" "$tmp/rootfs.tar" / >/dev/null
  buildah config --env PATH="$base_path" --env VIRTUAL_ENV="$venv" --env LANG=C.UTF-8 \
    --cmd python3 --created-by "mmdebstrap $suite $packages" "$ctr"
  buildah commit --quiet --rm --format oci "$ctr" "oci-archive:$tmp/base.tar:$base_ref" >/dev/null
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

# pip in the build trusts what the host trusts: on a host behind a TLS-intercepting proxy the
# index's certificate is signed by a CA only the host's bundle holds. The bundle is mounted for
# the build and given as the Dockerfile's build-time PIP_CERT; it does not end up in the image.
pip_args=()
host_ca=${PIP_CERT:-${REQUESTS_CA_BUNDLE:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}}
if [[ -f "$host_ca" ]]; then
  pip_args+=(--volume "$host_ca:/run/knr-build-ca.crt:ro" --build-arg PIP_CERT=/run/knr-build-ca.crt)
fi
# The index: the host's choice, else pip's default.
pip_args+=(--build-arg PIP_INDEX_URL="${PIP_INDEX_URL:-https://pypi.org/simple}")

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
  buildah bud --quiet --layers --force-rm --pull=never --isolation chroot --network host \
    --format oci \
    --build-arg PYTHON_IMAGE="$base_ref" --build-arg FUNCTION="$fn" --build-arg VERSION="$tag" \
    --label org.opencontainers.image.version="$tag" --env KN_RESCHEDULER_VERSION="$tag" \
    "${pip_args[@]}" \
    -t "$image" -f "$root/Dockerfile" "$root" >/dev/null
  # Writing the archive (compressing every layer) is most of a warm build: skipped when the
  # archive already holds this very image under this tag.
  id=$(buildah inspect --type image --format '{{.FromImageID}}' "$image")
  if [[ -s "$out/$fn.tar" ]] && [[ "$(cat "$out/$fn.id" 2>/dev/null)" == "$id $tag" ]]; then
    log "$fn: $out/$fn.tar unchanged ($((SECONDS - start)) s)"
    continue
  fi
  rm -f "$out/$fn.tar" "$out/$fn.id"
  buildah push --quiet "$image" "oci-archive:$out/$fn.tar:kn-rescheduler/$fn:$tag"
  echo "$id $tag" >"$out/$fn.id"
  log "$fn: $out/$fn.tar ($(du -h "$out/$fn.tar" | cut -f1)) in $((SECONDS - start)) s"
done
