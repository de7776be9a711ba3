#!/usr/bin/env bash
# Installs what the local cluster needs from Debian when it is missing: Prometheus (the server
# only), iproute2 (the local stack's network namespace), the daemonless image tools (mmdebstrap,
# buildah, skopeo, podman with runc) that `make images` and tests/e2e/test_images.py use, and
# what the real nodes' images and their local registry are made of (docker-registry,
# busybox-static, gcc with libc6-dev), and the real nodes' containerd and CNI plugins.
# `make cluster-bins` (and so `make test`, `make demo`, `make up`) and .ci/run call it; extra
# packages can be named in CI_APT_PACKAGES.
set -euo pipefail
# apt: the local cluster runs a real Prometheus (Debian's package; only the server, not its
# recommends). The harness runs its own prometheus process on a free loopback port and never
# the packaged service, which Debian's maintainer scripts would start on port 9090: a
# policy-rc.d answering 101 (the documented way to say "start no service") keeps invoke-rc.d and
# deb-systemd-invoke from starting it during the install, and it is disabled where systemd runs.
apt_packages="${CI_APT_PACKAGES:-}"
command -v prometheus >/dev/null || apt_packages+=" prometheus"
# apt: the images are built and run without a daemon or a registry. mmdebstrap makes the base
# root filesystem from Debian packages, buildah builds the Dockerfile on it, skopeo copies the
# OCI archives (into a registry on deploy), podman runs them in the image test. runc: crun,
# podman's default runtime, refuses hosts whose cgroups are in hybrid v1/v2 mode.
for tool in mmdebstrap buildah skopeo podman runc; do
  # runc is in /usr/sbin, which is not on every user's PATH.
  command -v "$tool" >/dev/null || [[ -x /usr/sbin/$tool ]] || apt_packages+=" $tool"
done
# podman looks for a network backend even for --network host, and Debian's podman only
# recommends one.
[[ -x /usr/lib/podman/netavark ]] || apt_packages+=" netavark"
# apt: the real nodes pull their pause and busybox images (hack/build-node-images.sh) from a
# local registry, Debian's docker-registry (the CNCF distribution registry). The busybox image is
# Debian's statically linked busybox (busybox-static, which replaces the dynamically linked
# busybox package), the pause image upstream's pause.c linked statically: gcc and libc6-dev's
# libc.a.
[[ -x /usr/bin/docker-registry ]] || apt_packages+=" docker-registry"
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' ||
  apt_packages+=" busybox-static"
command -v gcc >/dev/null || apt_packages+=" gcc"
[[ -f /usr/include/stdio.h ]] || apt_packages+=" libc6-dev"
# apt: Knative's data plane runs in a network namespace of the local stack's own (ip netns)
# and the tests list its sockets (ss): iproute2.
{ command -v ip && command -v ss; } >/dev/null || apt_packages+=" iproute2"
# apt: the local cluster's real nodes (REAL_NODES=N, dev/localcluster/realnode.py) run a real
# kubelet on Debian's containerd (its packaged service is never started: each node runs its
# own containerd with its own socket) and the CNI plugins (bridge, host-local).
command -v containerd >/dev/null || apt_packages+=" containerd"
[[ -x /usr/lib/cni/bridge ]] || apt_packages+=" containernetworking-plugins"
# Each real node's kube-proxy writes its Services' rules with iptables (in the node's own
# network namespace), and the nodes' processes are started there with util-linux's nsenter.
[[ -x /usr/sbin/iptables-restore ]] || apt_packages+=" iptables"
command -v nsenter >/dev/null || apt_packages+=" util-linux"
# NetworkPolicies on the real nodes: kube-router's firewall keeps its selectors in ipsets
# (dev/localcluster/networkpolicies.py).
command -v ipset >/dev/null || apt_packages+=" ipset"
# Knative Eventing's images (hack/build-knative-eventing.sh): a registry on loopback for ko's
# base image, asked with curl, whose base holds the machine's CA certificates.
command -v curl >/dev/null || apt_packages+=" curl"
[[ -f /etc/ssl/certs/ca-certificates.crt ]] || apt_packages+=" ca-certificates"
if [[ -n "${apt_packages// /}" ]] && [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
  own_policy=""
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    own_policy=1
  fi
  installed=1
  apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $apt_packages ||
    installed=""
  if [[ -n "$own_policy" ]]; then rm -f /usr/sbin/policy-rc.d; fi
  [[ -n "$installed" ]] || { echo "apt-get could not install:$apt_packages" >&2; exit 1; }
  if [[ -d /run/systemd/system ]]; then
    systemctl disable --now prometheus.service >/dev/null 2>&1 || true
    systemctl disable --now containerd.service >/dev/null 2>&1 || true
    # Likewise the packaged registry (port 5000): the harness runs its own (registry.py).
    systemctl disable --now docker-registry.service >/dev/null 2>&1 || true
  fi
fi
command -v prometheus >/dev/null || {
  echo "prometheus is missing: install Debian's prometheus package (see docs/development.md)" >&2
  exit 1
}
