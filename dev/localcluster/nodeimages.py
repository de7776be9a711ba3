"""Finds (building on first use) the images the real nodes run: pause, busybox and CoreDNS.

A real node (kubelet + containerd) needs a pod sandbox image and the test pods need something to
run, and no registry on the internet is reachable: ``hack/build-node-images.sh`` makes both from
what is on the machine (the kubelet's own pause.c, Debian's static busybox) as OCI archives in
a cache keyed by their inputs, and prints that directory; a second call answers at once. The
archives are then pushed into the cluster's :class:`localcluster.registry.LocalRegistry`.

An image is known by two names: the one in its archive (``kn-rescheduler.local/pause:3.10.2``,
what pod specs and containerd's sandbox image say, with ``kn-rescheduler.local`` mapped to the
local registry in containerd's configuration) and its name in the registry (``pause:3.10.2``,
under ``127.0.0.1:PORT``). The tags are fixed local names, not the versions inside: see the
script's header.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from dev.localcluster.bins import REPO_ROOT, BinsError, run_build_script
from dev.localcluster.registry import LocalRegistry, RegistryError

BUILD_SCRIPT: Final = REPO_ROOT / "hack" / "build-node-images.sh"
# The registry host in the images' own names: no host on any network (.local is mDNS), so a pull
# not redirected to the local registry fails instead of reaching out.
IMAGE_HOST: Final = "kn-rescheduler.local"
PAUSE_ARCHIVE: Final = "pause.oci.tar"
BUSYBOX_ARCHIVE: Final = "busybox.oci.tar"
# repository:tag in the registry; the script tags the archives IMAGE_HOST/<these>.
PAUSE_NAME: Final = "pause:3.10.2"
BUSYBOX_NAME: Final = "busybox:1.35"
PAUSE_IMAGE: Final = f"{IMAGE_HOST}/{PAUSE_NAME}"
BUSYBOX_IMAGE: Final = f"{IMAGE_HOST}/{BUSYBOX_NAME}"
# CoreDNS keeps the name Kubernetes' add-on manifest gives it; the nodes mirror this host too.
UPSTREAM_HOST: Final = "registry.k8s.io"
# Knative's releases, where manifests written for any cluster name images (kn-rescheduler's
# dead-letters sink names Knative's event-display there): mirrored to the local registry too,
# which holds only what was built here.
KNATIVE_RELEASES_HOST: Final = "gcr.io"
COREDNS_ARCHIVE: Final = "coredns.oci.tar"


def coredns_version() -> str:
    """The CoreDNS version hack/coredns/go.mod pins (the one the add-on manifest names)."""
    for line in (REPO_ROOT / "hack" / "coredns" / "go.mod").read_text().splitlines():
        fields = line.split()
        if fields[:2] == ["require", "github.com/coredns/coredns"]:
            return fields[2]
    raise NodeImagesError("hack/coredns/go.mod requires no github.com/coredns/coredns")


class NodeImagesError(RuntimeError):
    """The node images could not be built or pushed (the message says why)."""


COREDNS_NAME: Final = f"coredns/coredns:{coredns_version()}"
# archive file name -> name in the registry (the archive's own name: its host and this).
ARCHIVES: Final = {
    PAUSE_ARCHIVE: (IMAGE_HOST, PAUSE_NAME),
    BUSYBOX_ARCHIVE: (IMAGE_HOST, BUSYBOX_NAME),
    COREDNS_ARCHIVE: (UPSTREAM_HOST, COREDNS_NAME),
}


def ensure_node_images() -> Path:
    """The directory holding the ARCHIVES and CoreDNS's manifest; builds them first when needed
    (a few seconds, and CoreDNS's Go build the first time)."""
    try:
        directory = Path(run_build_script(BUILD_SCRIPT))
    except BinsError as err:
        raise NodeImagesError(str(err)) from err
    absent = [a for a in ARCHIVES if not (directory / a).is_file()]
    if absent:
        raise NodeImagesError(
            f"hack/{BUILD_SCRIPT.name} printed {directory}, which lacks {', '.join(absent)}"
        )
    return directory


def push_node_images(registry: LocalRegistry, directory: Path) -> dict[str, str]:
    """Pushes every archive in ``directory`` (from ensure_node_images) into ``registry``;
    returns image name (PAUSE_IMAGE, BUSYBOX_IMAGE, CoreDNS's) -> its reference there."""
    pushed = {}
    for archive, (host, name) in ARCHIVES.items():
        try:
            pushed[f"{host}/{name}"] = registry.push(directory / archive, name)
        except RegistryError as err:
            raise NodeImagesError(f"pushing {archive}: {err}") from err
    return pushed
