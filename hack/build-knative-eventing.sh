#!/usr/bin/env bash
# Builds Knative Eventing the way Knative releases it, for a cluster to install as a user does:
# `ko resolve` over the config/ manifests of the knative.dev/eventing module pinned in
# hack/adapter/go.mod, as its own hack/generate-yamls.sh does, into
#
#   eventing-core.yaml        config/core (CRDs, controller, webhook, ApiServerSource and
#                             PingSource adapters, job sink, request-reply)
#   mt-channel-broker.yaml    config/brokers/mt-channel-broker (the MT channel-based Broker)
#   in-memory-channel.yaml    config/channels/in-memory-channel
#   event-display.yaml        Knative's event-display as a Deployment and Service
#                             (hack/knative/event-display.yaml): a user's receiver of events
#   images/                   every image those name, as an OCI layout
#
# The manifests are ko's output unchanged: each `ko://` reference became
# kn-rescheduler.local/knative/<command>-<hash>@sha256:<digest>, the digest of the image in
# images/. A real-node cluster pushes the images into its registry, which its nodes' containerd
# serves kn-rescheduler.local from, and applies the manifests (dev/localcluster/knative.py).
#
# ko is built from its own Go module; the commands are built from hack/adapter, whose go.mod
# pins the eventing module (the data plane processes of the local stack share its build cache).
# Knative's base image is distroless static:nonroot, from a registry this machine cannot reach;
# an image with what it holds (/etc/passwd and /etc/group naming nonroot, 65532, CA
# certificates, /tmp) is built here without a daemon and served to ko by a registry on
# loopback for the time of the build. The output is cached by everything that goes into it; a
# second run answers at once. The last stdout line is the output directory.
#
# Environment: KN_RESCHEDULER_CACHE (the cache root, shared with hack/build-bins.sh).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache_root=${KN_RESCHEDULER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kn-rescheduler}
KO_VERSION=${KO_VERSION:-v0.19.1}
EVENTING_VERSION=$(awk '$1 == "knative.dev/eventing" {print $2}' "$here/adapter/go.mod")
KO_DOCKER_REPO=kn-rescheduler.local/knative
BASE_REF=kn-rescheduler.local/static:nonroot
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt

log() { printf '[knative-eventing %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

missing=()
for tool in buildah skopeo go docker-registry curl; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
[[ -f "$CA_BUNDLE" ]] || missing+=(ca-certificates)
if ((${#missing[@]})); then
  echo "building Knative Eventing's images needs ${missing[*]} (Debian: hack/install-packages.sh" \
    "installs them)" >&2
  exit 1
fi

key=$(printf '%s\n' "$EVENTING_VERSION" "$KO_VERSION" "$(go version)" "$(sha256sum <"$0")" \
  "$(sha256sum <"$here/knative/event-display.yaml")" \
  "$(cat "$here/adapter/go.mod" "$here/adapter/go.sum" | sha256sum)" \
  "$(dpkg-query -W -f='${Version}' ca-certificates 2>/dev/null || sha256sum <"$CA_BUNDLE")" |
  sha256sum | cut -c1-16)
out="$cache_root/knative-eventing-install/$EVENTING_VERSION-$key"
mkdir -p "$out"
manifests=(eventing-core mt-channel-broker in-memory-channel event-display)
complete() {
  local m
  for m in "${manifests[@]}"; do [[ -s "$out/$m.yaml" ]] || return 1; done
  [[ -s "$out/images/index.json" ]]
}
if complete; then
  log "$EVENTING_VERSION: cached"
  echo "$out"
  exit 0
fi
exec 9>"$out/.lock"
flock 9
if complete; then
  log "$EVENTING_VERSION: built meanwhile"
  echo "$out"
  exit 0
fi
start=$SECONDS

# ko, from its own go.mod.
ko="$cache_root/bins/ko-$KO_VERSION/ko"
if [[ ! -x "$ko" ]]; then
  log "ko $KO_VERSION: building github.com/google/ko"
  mkdir -p "$(dirname "$ko")"
  GOBIN="$(dirname "$ko")" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" \
    "github.com/google/ko@$KO_VERSION"
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/knr-knative.XXXXXX")
registry_pid=""
bh=(buildah --root "$tmp/storage" --runroot "$tmp/run" --storage-driver vfs)
cleanup() {
  [[ -z "$registry_pid" ]] || kill "$registry_pid" 2>/dev/null || true
  "${bh[@]}" rm --all >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# The base: what distroless static:nonroot holds that the Knative binaries use.
log "base image $BASE_REF"
root="$tmp/base"
mkdir -p "$root/etc/ssl/certs" "$root/tmp" "$tmp/home/nonroot"
chmod 1777 "$root/tmp"
printf '%s\n' "root:x:0:0:root:/root:/sbin/nologin" \
  "nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin" \
  "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin" >"$root/etc/passwd"
printf '%s\n' "root:x:0:" "nobody:x:65534:" "nonroot:x:65532:" >"$root/etc/group"
cp "$CA_BUNDLE" "$root/etc/ssl/certs/ca-certificates.crt"
ctr=$("${bh[@]}" from --quiet scratch)
"${bh[@]}" copy --quiet --chown 0:0 "$ctr" "$root" / >/dev/null
"${bh[@]}" copy --quiet --chown 65532:65532 "$ctr" "$tmp/home" /home >/dev/null
"${bh[@]}" config --user 65532:65532 --workingdir /home/nonroot \
  --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
  --label "org.opencontainers.image.source=kn-rescheduler hack/build-knative-eventing.sh" "$ctr"
"${bh[@]}" commit --quiet --rm --format oci --timestamp 0 --identity-label=false "$ctr" \
  "$BASE_REF" >/dev/null
"${bh[@]}" push --quiet "$BASE_REF" "oci-archive:$tmp/base.tar:$BASE_REF"

# A registry on loopback for ko to read the base from, for the time of this build.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$tmp/registry.yml" <<EOF
version: 0.1
log: {level: error}
storage: {filesystem: {rootdirectory: $tmp/registry}}
http: {addr: 127.0.0.1:$port, secret: build-only}
EOF
docker-registry serve "$tmp/registry.yml" >"$tmp/registry.log" 2>&1 &
registry_pid=$!
for _ in $(seq 100); do
  curl -fs "http://127.0.0.1:$port/v2/" >/dev/null && break
  sleep 0.1
done
skopeo copy --quiet --dest-tls-verify=false "oci-archive:$tmp/base.tar" \
  "docker://127.0.0.1:$port/static:nonroot"

# The manifests, from the module; ko builds what they name from hack/adapter.
module=$(cd "$here/adapter" && go list -m -f '{{.Dir}}' knative.dev/eventing)
cp -r "$module/config" "$tmp/config"
chmod -R u+w "$tmp/config"
# In Knative's repository config/core/configmaps/eventing-{integrations,transformations}-images
# .yaml are symlinks into third_party/eventing-integrations-latest; a Go module zip keeps no
# symlinks, and the controller's Deployment reads both ConfigMaps. Put them back.
for cm in "$module"/third_party/eventing-integrations-latest/*.yaml; do
  cp "$cm" "$tmp/config/core/configmaps/"
done
chmod -R u+w "$tmp/config"
rm -rf "$out/images" "$out"/*.yaml.tmp
resolve() { # output-name config-dir-or-file
  log "ko resolve $2 (the first build compiles Knative: several minutes on 2 cores)"
  (cd "$here/adapter" &&
    KO_DOCKER_REPO=$KO_DOCKER_REPO KO_DEFAULTBASEIMAGE="127.0.0.1:$port/static:nonroot" \
      "$ko" resolve --push=false --platform=linux/amd64 \
      --oci-layout-path "$out/images" --tarball /dev/null -R -f "$2") \
    >"$out/$1.yaml.tmp"
  mv "$out/$1.yaml.tmp" "$out/$1.yaml"
}
resolve eventing-core "$tmp/config/core"
resolve mt-channel-broker "$tmp/config/brokers/mt-channel-broker"
resolve in-memory-channel "$tmp/config/channels/in-memory-channel"
resolve event-display "$here/knative/event-display.yaml"
log "built in $((SECONDS - start)) s: $(grep -ho "$KO_DOCKER_REPO/[a-z_]*" "$out"/*.yaml | sort -u | wc -l) images"
echo "$out"
