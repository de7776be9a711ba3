"""Knative Eventing installed on a real-node cluster as a platform team installs it.

``hack/build-knative-eventing.sh`` builds Eventing the way Knative releases it (``ko resolve``
over the ``config/`` of the pinned knative.dev/eventing module) into three manifests and an OCI
layout of the images they name, by digest, under ``kn-rescheduler.local/knative``. Installing
is then what a user does with Knative's release files, on a cluster whose nodes pull
``kn-rescheduler.local`` from the local registry:

1. every image the manifests name is pushed into the cluster's registry, byte for byte (the
   digest in the manifest is the digest pulled);
2. ``kubectl apply`` of eventing-core.yaml, then in-memory-channel.yaml, then
   mt-channel-broker.yaml, each once what the one before it runs is available (the later
   files hold ConfigMaps that Eventing's own webhook validates).

Knative's controllers, webhook and data plane then run as pods and write every status
themselves.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dev.localcluster.bins import REPO_ROOT, BinsError, run_build_script
from dev.localcluster.nodeimages import IMAGE_HOST, KNATIVE_RELEASES_HOST
from dev.localcluster.registry import LocalRegistry, RegistryError

BUILD_SCRIPT: Final = REPO_ROOT / "hack" / "build-knative-eventing.sh"
NAMESPACE: Final = "knative-eventing"
# In the order a user applies them (docs/install-without-serving.md).
MANIFESTS: Final = ("eventing-core.yaml", "in-memory-channel.yaml", "mt-channel-broker.yaml")
# Knative's event-display as a Deployment and Service (hack/knative/event-display.yaml): the
# receiver a user points a Trigger at to see events; applied by whoever wants one.
EVENT_DISPLAY: Final = "event-display.yaml"
IMAGE_REF: Final = re.compile(
    rf"{re.escape(IMAGE_HOST)}/(knative/[a-z0-9._/-]+)@(sha256:[0-9a-f]{{64}})"
)


class KnativeError(RuntimeError):
    """Knative Eventing could not be built or installed (the message says why)."""


@dataclass(frozen=True)
class Image:
    """An image a manifest names: its repository under IMAGE_HOST, and its digest."""

    repository: str
    digest: str


def ensure_eventing() -> Path:
    """The directory with the manifests and ``images/`` (builds them on first use: ko and
    Knative's commands, several minutes on 2 cores; at once after)."""
    try:
        directory = Path(run_build_script(BUILD_SCRIPT))
    except BinsError as err:
        raise KnativeError(str(err)) from err
    wanted = (*MANIFESTS, EVENT_DISPLAY, "images/index.json")
    absent = [m for m in wanted if not (directory / m).is_file()]
    if absent:
        raise KnativeError(f"{BUILD_SCRIPT.name} printed {directory}, which lacks {absent}")
    return directory


def images(manifest: str) -> list[Image]:
    """Every image ``manifest`` names, once each, in order (pure)."""
    seen: dict[tuple[str, str], Image] = {}
    for repository, digest in IMAGE_REF.findall(manifest):
        seen.setdefault((repository, digest), Image(repository, digest))
    return list(seen.values())


def push_images(registry: LocalRegistry, directory: Path) -> list[str]:
    """Every image of every manifest, from ``directory/images`` into ``registry``."""
    pushed = []
    for name in (*MANIFESTS, EVENT_DISPLAY):
        for image in images((directory / name).read_text()):
            try:
                pushed.append(
                    registry.push_from_layout(directory / "images", image.repository, image.digest)
                )
            except RegistryError as err:
                raise KnativeError(f"{name}: {err}") from err
    return pushed


# Where Knative publishes event-display, the image manifests written for any cluster name.
EVENT_DISPLAY_RELEASE: Final = "knative-releases/knative.dev/eventing/cmd/event_display"


def event_display_reference(digest: str) -> str:
    """The release name of event-display at ``digest`` (pure): how kn-rescheduler's
    dead-letters sink names it, pinned to the Eventing built here."""
    return f"{KNATIVE_RELEASES_HOST}/{EVENT_DISPLAY_RELEASE}@{digest}"


def push_event_display_release(registry: LocalRegistry, directory: Path) -> str:
    """ko's event-display also under its release name, by digest and as ``latest`` (nodes
    mirror gcr.io to the local registry); returns that name at its digest. knative/ pins the
    sink to a released digest, which the registry here cannot hold (it holds only what was
    built here): a deploy here names this one instead (``DEAD_LETTERS_IMAGE``), as a user names
    the event_display of the Eventing release they run."""
    (image,) = images((directory / EVENT_DISPLAY).read_text())
    try:
        registry.push_from_layout(
            directory / "images", EVENT_DISPLAY_RELEASE, image.digest, tag="latest"
        )
    except RegistryError as err:
        raise KnativeError(f"event-display as {EVENT_DISPLAY_RELEASE}: {err}") from err
    return event_display_reference(image.digest)


def kubectl_apply(kubectl: Path, kubeconfig: Path, manifest: Path) -> None:
    # Server-side: Knative's CRDs are larger than client-side apply's annotation can hold.
    argv = [str(kubectl), f"--kubeconfig={kubeconfig}", "apply", "--server-side"]
    argv += ["--field-manager=kubectl", "-f", str(manifest)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise KnativeError(f"kubectl apply -f {manifest.name}: {e}") from e
    if done.returncode != 0:
        raise KnativeError(f"kubectl apply -f {manifest.name} failed:\n{done.stderr.strip()}")


def unavailable(deployments: list[dict[str, Any]]) -> list[str]:
    """The Deployments (of a list) that want replicas and have none available (pure)."""
    waiting = []
    for d in deployments:
        wanted = d.get("spec", {}).get("replicas", 1)
        available = d.get("status", {}).get("availableReplicas") or 0
        if wanted and available < 1:
            waiting.append(d["metadata"]["name"])
    return sorted(waiting)


def install(
    registry: LocalRegistry,
    kubectl: Path,
    kubeconfig: Path,
    directory: Path,
    *,
    deployments: Callable[[], list[dict[str, Any]]],
    deadline: float,
    say: Callable[[str], None] = lambda _: None,
) -> str:
    """Pushes the images, then applies each manifest once the Deployments of the ones before
    are available (``deployments()`` lists knative-eventing's). Returns event-display's
    release name at the digest pushed (push_event_display_release)."""
    pushed = push_images(registry, directory)
    event_display = push_event_display_release(registry, directory)
    say(f"Knative Eventing: {len(pushed)} images pushed to {registry.host}")
    for name in MANIFESTS:
        # The webhook may still be starting after the previous file: apply again until it
        # answers (what `kubectl apply` in a retry loop of an installer does).
        while True:
            try:
                kubectl_apply(kubectl, kubeconfig, directory / name)
                break
            except KnativeError as err:
                if time.monotonic() > deadline:
                    raise
                if "webhook" not in str(err) and "no matches for kind" not in str(err):
                    raise
                time.sleep(2.0)
        while waiting := unavailable(deployments()):
            if time.monotonic() > deadline:
                raise KnativeError(
                    f"after {name}, Deployments in {NAMESPACE} not available in time: {waiting} "
                    f"(kubectl -n {NAMESPACE} describe pods)"
                )
            time.sleep(1.0)
        say(f"Knative Eventing: {name} applied and available")
    return event_display
