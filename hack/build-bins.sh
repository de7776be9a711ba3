#!/usr/bin/env bash
# Builds the real control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl), the kubelet and kube-proxy of the real nodes, and kwok from their
# Go modules, into a cache keyed by version, so that a second run builds nothing. The first
# build takes a while on 2 cores; it says so.
#
#   hack/build-bins.sh                  everything (make cluster-bins)
#   hack/build-bins.sh control-plane    what a cluster of kwok nodes runs (make demo, make up)
#   hack/build-bins.sh nodes            the real nodes' kubelet and kube-proxy
#
# The Kubernetes binaries missing are built by one `go build`: the packages they share compile
# once and both cores stay busy to the last link.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
K8S_VERSION=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" {print $3}' "$here/bins/go.mod")
ETCD_VERSION=$(awk '$1 == "go.etcd.io/etcd/server/v3" {print $2}' "$here/bins/go.mod")
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
cache_root=${KN_RESCHEDULER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kn-rescheduler}
out="$cache_root/bins/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION"
mkdir -p "$out"

log() { printf '[cluster-bins %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# Version stamps: without them the binaries report v0.0.0 and clients warn about skew.
major=${K8S_VERSION#v}; minor=${major#*.}; major=${major%%.*}; minor=${minor%%.*}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

want_control_plane=0 want_nodes=0
(($# == 0)) && set -- control-plane nodes
for part in "$@"; do
  case $part in
    control-plane) want_control_plane=1 ;;
    nodes) want_nodes=1 ;;
    *) echo "build-bins: unknown part '$part' (control-plane, nodes)" >&2; exit 2 ;;
  esac
done

declare -A packages=()
if ((want_control_plane)); then
  packages[kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
  packages[kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
  packages[kube-scheduler]=k8s.io/kubernetes/cmd/kube-scheduler
  packages[kubectl]=k8s.io/kubernetes/cmd/kubectl
fi
if ((want_nodes)); then
  # The real nodes' kubelet (docs/local-cluster-real-nodes.md). CGO_ENABLED=0 as for the
  # rest: it then talks to the container runtime only over CRI, which is all they use.
  packages[kubelet]=k8s.io/kubernetes/cmd/kubelet
  # Each real node's kube-proxy (iptables mode, in the node's network namespace): Services.
  packages[kube-proxy]=k8s.io/kubernetes/cmd/kube-proxy
fi

if ((want_control_plane)); then
  if [[ -x "$out/etcd" ]]; then
    log "etcd: cached"
  else
    # Its binary would be named after the module's last element (v3): a build of its own.
    log "etcd: building go.etcd.io/etcd/server/v3"
    start=$SECONDS
    (cd "$here/bins" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out/etcd.tmp" go.etcd.io/etcd/server/v3)
    mv "$out/etcd.tmp" "$out/etcd"
    log "etcd: built in $((SECONDS - start)) s"
  fi
fi

missing=()
for name in "${!packages[@]}"; do
  if [[ -x "$out/$name" ]]; then log "$name: cached"; else missing+=("$name"); fi
done
if ((${#missing[@]})); then
  log "${missing[*]}: building (a first build compiles Kubernetes: several minutes)"
  start=$SECONDS
  tmp="$out/.build"
  rm -rf "$tmp" && mkdir -p "$tmp"
  pkgs=()
  for name in "${missing[@]}"; do pkgs+=("${packages[$name]}"); done
  (cd "$here/bins" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}")
  for name in "${missing[@]}"; do mv "$tmp/$name" "$out/$name"; done
  rm -rf "$tmp"
  log "${missing[*]}: built in $((SECONDS - start)) s"
fi

if ((want_control_plane)); then
  if [[ -x "$out/kwok" ]]; then
    log "kwok: cached"
  else
    # kwok is built from its own go.mod (go install pkg@version), not ours.
    log "kwok: building sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
    start=$SECONDS
    tmp=$(mktemp -d)
    GOBIN="$tmp" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
    mv "$tmp/kwok" "$out/kwok"
    rm -rf "$tmp"
    log "kwok: built in $((SECONDS - start)) s"
  fi
fi

echo "$out"
