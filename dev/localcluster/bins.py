"""Finds (building on first use) the control-plane binaries.

``hack/build-bins.sh`` compiles etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
kubectl and kwok from their pinned Go modules into a cache keyed by version and prints that
directory; a second call answers at once. The real nodes' kubelet and kube-proxy are built only
for a cluster that has real nodes: a first ``make demo`` does not wait for them. Its progress
goes to our stderr, because the first build takes minutes and a silent wait looks like a hang.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import deque
from pathlib import Path
from typing import Final

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
BUILD_SCRIPT: Final = REPO_ROOT / "hack" / "build-bins.sh"
HELM_SCRIPT: Final = REPO_ROOT / "hack" / "build-helm.sh"
KREW_SCRIPT: Final = REPO_ROOT / "hack" / "build-krew.sh"
BINARIES: Final = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
)
NODE_BINARIES: Final = ("kubelet", "kube-proxy")
# Points at an existing directory of binaries and skips the build (for machines that have them).
ENV_BINS_DIR: Final = "KN_RESCHEDULER_BINS"


class BinsError(RuntimeError):
    """The binaries could not be built or are incomplete."""


def missing(directory: Path, *, real_nodes: bool = False) -> list[str]:
    """The binaries absent (or not executable) in ``directory``."""
    wanted = BINARIES + NODE_BINARIES if real_nodes else BINARIES
    return [b for b in wanted if not os.access(directory / b, os.X_OK)]


def run_build_script(script: Path, *args: str) -> str:
    """Runs one of hack/'s build scripts, its progress on our stderr, and returns the last line
    it prints (the path of what it built or found cached). Raises BinsError on failure, with
    the script's last lines of progress (in a long build's output the cause is easy to miss)."""
    tail: deque[str] = deque(maxlen=20)
    with subprocess.Popen(
        ["bash", str(script), *args],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        # The script's stdout is one line at the very end, so reading stderr to its end
        # first cannot block on a full stdout pipe.
        for line in proc.stderr:
            tail.append(line.rstrip("\n"))
            sys.stderr.write(line)
            sys.stderr.flush()
        out = proc.stdout.read()
        code = proc.wait()
    name = f"hack/{script.name}"
    if code != 0:
        last = "\n".join(tail)
        raise BinsError(f"{name} failed with exit code {code}; its last lines:\n{last}")
    lines = out.strip().splitlines()
    if not lines:
        raise BinsError(f"{name} printed no path")
    return lines[-1]


def ensure_bins(*, real_nodes: bool = False) -> Path:
    """The directory holding the control plane's binaries, and the real nodes' with
    ``real_nodes``; builds what is missing first."""
    override = os.environ.get(ENV_BINS_DIR)
    parts = ("control-plane", "nodes") if real_nodes else ("control-plane",)
    directory = Path(override) if override else Path(run_build_script(BUILD_SCRIPT, *parts))
    absent = missing(directory, real_nodes=real_nodes)
    if absent:
        raise BinsError(f"{directory} lacks {', '.join(absent)}")
    return directory


def ensure_helm() -> Path:
    """Helm, the version hack/helm/go.mod pins, built on first use."""
    return Path(run_build_script(HELM_SCRIPT))


def ensure_krew() -> Path:
    """Krew, the version hack/krew/go.mod pins, built on first use."""
    return Path(run_build_script(KREW_SCRIPT))
