#!/usr/bin/env bash
# Installs what the local cluster needs from Debian when it is missing: Prometheus (the server
# only), iproute2 (the local stack's network namespace), and the daemonless image tools (mmdebstrap, buildah, skopeo, podman with runc) that
# `make images` and tests/e2e/test_images.py use. `make cluster-bins` (and so `make test`,
# `make demo`, `make up`) and .ci/run call it; extra packages can be named in CI_APT_PACKAGES.
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
# apt: Knative's data plane runs in a network namespace of the local stack's own (ip netns)
# and the tests list its sockets (ss): iproute2.
{ command -v ip && command -v ss; } >/dev/null || apt_packages+=" iproute2"
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
  fi
fi
command -v prometheus >/dev/null || {
  echo "prometheus is missing: install Debian's prometheus package (see docs/development.md)" >&2
  exit 1
}
