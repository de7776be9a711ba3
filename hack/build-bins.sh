#!/usr/bin/env bash
# Builds the real control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl), the kubelet and kube-proxy of the real nodes, and kwok from their
# Go modules, into a cache keyed by version, so that a second run builds nothing. The first
# build takes a while on 2 cores; it says so.
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

build() { # name package
  local name=$1 pkg=$2
  if [[ -x "$out/$name" ]]; then
    log "$name: cached"
    return
  fi
  log "$name: building $pkg (first build compiles Kubernetes: several minutes)"
  local start=$SECONDS
  (cd "$here/bins" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out/$name.tmp" "$pkg")
  mv "$out/$name.tmp" "$out/$name"
  log "$name: built in $((SECONDS - start)) s"
}

build etcd go.etcd.io/etcd/server/v3
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager
build kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler
build kubectl k8s.io/kubernetes/cmd/kubectl
# The real nodes' kubelet (docs/local-cluster.md, "Real nodes"). CGO_ENABLED=0 as above: it
# then talks to the container runtime only over CRI, which is all the real nodes use.
build kubelet k8s.io/kubernetes/cmd/kubelet
# Each real node's kube-proxy (iptables mode, in the node's network namespace): Services.
build kube-proxy k8s.io/kubernetes/cmd/kube-proxy

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

echo "$out"
