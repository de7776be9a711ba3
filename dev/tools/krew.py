"""The kubectl plugin as Krew installs it: one archive per platform, and the manifest.

Krew downloads a plugin's archive for the user's OS and architecture, unpacks it into its store
and links the executable the manifest names onto the PATH. The plugin is Python (it runs the
functions' own decision code), so each archive holds:

- ``kubectl-kn_rescheduler``: a launcher, ``#!/usr/bin/env python3``, that puts the ``lib``
  beside its real path first on ``sys.path`` and runs the plugin;
- ``lib/``: the plugin, the ``shared`` code it runs, and its dependencies at the versions of
  requirements.lock, as pip installs them for that platform, for each CPython from 3.11 to
  3.14. Pure-Python files are the same for all of them; the compiled modules (pydantic-core,
  which the Kubernetes client needs, PyYAML's and charset-normalizer's speedups) are named by
  Python version (``.cpython-312-darwin.so``), so each interpreter loads its own;
- ``LICENSE``.

Not in them: orjson (score-nodes' hot path, never the plugin's) and functions-framework (the
plugin serves nothing). Windows is not listed: Krew runs ``kubectl-kn_rescheduler.exe`` there,
and a Python launcher is no executable to Windows.

Every archive is the same bytes every time: the same wheels, entries in order, times fixed, no
bytecode, no install records (they name the machine's paths).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import yaml

from dev.tools.tgz import deterministic_tgz

REPO: Final = Path(__file__).resolve().parents[2]
LOCK: Final = REPO / "requirements.lock"
EXECUTABLE: Final = "kubectl-kn_rescheduler"
PLUGIN: Final = "kn-rescheduler"
HOMEPAGE: Final = "https://github.com/kn-rescheduler/kn-rescheduler"
# Where a release's files are downloaded from: URL/vVERSION/FILE.
RELEASES: Final = HOMEPAGE + "/releases/download"
# What the plugin imports beyond the standard library (pyproject.toml's dependencies, less the
# two above, and Flask, whose request type the functions' event code speaks); pip brings what
# these need, at the versions of the lock.
REQUIREMENTS: Final = (
    "kubernetes",
    "cloudevents",
    "flask",
    "jsonpatch",
    "prometheus-client",
    "PyYAML",
    "requests",
)
# Our code in the zip: the plugin and the code of the functions it runs.
PACKAGES: Final = ("kubectl_kn_rescheduler", "shared")
LAUNCHER: Final = '''#!/usr/bin/env python3
"""kubectl kn-rescheduler, as Krew installs it (docs/plugin.md): the plugin and its
dependencies are in lib/, beside this file's real path (Krew links it from its bin/)."""
import os
import sys

if not (3, 11) <= sys.version_info[:2] <= (3, 14):
    sys.exit("kubectl kn-rescheduler needs Python 3.11 to 3.14, not " + sys.version.split()[0])
sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "lib"))

from kubectl_kn_rescheduler.cli import run  # noqa: E402

sys.exit(run())
'''
# Left out: bytecode, scripts, and the records of an install on this machine.
_LEFT_OUT: Final = re.compile(
    r"(\.pyc$|(^|/)__pycache__/|^bin/|\.dist-info/(RECORD|INSTALLER|REQUESTED|direct_url\.json)$)"
)


class KrewError(RuntimeError):
    """The plugin's archives or manifest cannot be made; the message says why."""


@dataclass(frozen=True)
class Platform:
    os: str
    arch: str
    # pip's --platform values for wheels of this OS and architecture. pip takes older macOS
    # versions (and universal2) by itself, but each manylinux version only when named.
    wheels: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.os}-{self.arch}"


def _manylinux(arch: str) -> tuple[str, ...]:
    """glibc 2.17 (CentOS 7) to 2.28: what the wheels of the lock are built for."""
    return (f"manylinux2014_{arch}", *(f"manylinux_2_{v}_{arch}" for v in (17, 24, 27, 28)))


PLATFORMS: Final = (
    Platform("linux", "amd64", _manylinux("x86_64")),
    Platform("linux", "arm64", _manylinux("aarch64")),
    Platform("darwin", "amd64", ("macosx_11_0_x86_64",)),
    Platform("darwin", "arm64", ("macosx_11_0_arm64",)),
)
PYTHONS: Final = ("3.11", "3.12", "3.13", "3.14")


def pins(lock: Path = LOCK) -> list[str]:
    """``name==version`` of every package of the lock, its hashes left out (a constraint)."""
    found = re.findall(r"(?m)^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\]+)", lock.read_text())
    return [f"{name}=={version}" for name, version in found]


def dependencies(target: Path, platform: Platform, python: str) -> None:
    """pip installs the plugin's dependencies for ``platform`` and CPython ``python``, at the
    lock's versions, into ``target`` (wheels only: nothing is built here)."""
    constraints = target.parent / "constraints.txt"
    constraints.write_text("\n".join(pins()) + "\n")
    done = subprocess.run(
        [
            sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
            "--no-compile", "--only-binary=:all:",
            *(f"--platform={tag}" for tag in platform.wheels),
            "--python-version", python, "--implementation", "cp", "--target", str(target),
            "--constraint", str(constraints), *REQUIREMENTS,
        ],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise KrewError(
            f"pip could not install the plugin's dependencies for {platform.name}, "
            f"Python {python}:\n{done.stderr}"
        )


def _ours() -> dict[str, bytes]:
    """Our packages' tracked Python files, by path under lib/."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--", *(f"{p}/*.py" for p in PACKAGES)],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    return {name: (REPO / name).read_bytes() for name in listed.decode().split("\0") if name}


def _installed(site: Path) -> dict[str, bytes]:
    return {
        path.relative_to(site).as_posix(): path.read_bytes()
        for path in sorted(site.rglob("*"))
        if path.is_file() and not _LEFT_OUT.search(path.relative_to(site).as_posix())
    }


def installed(tmp: Path, platforms: Sequence[Platform] = PLATFORMS) -> dict[Platform, list[Path]]:
    """pip installs the dependencies for every platform and Python, several at a time (each
    mostly waits on unpacking wheels), each into its own folder under ``tmp``."""
    jobs = [(p, python, tmp / p.name / python / "site") for p in platforms for python in PYTHONS]
    for _, _, site in jobs:
        site.parent.mkdir(parents=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda job: dependencies(job[2], job[0], job[1]), jobs))
    return {p: [site for q, _, site in jobs if q == p] for p in platforms}


def tree(platform: Platform, sites: Sequence[Path]) -> dict[str, tuple[bytes, int]]:
    """The archive's files for ``platform``, from its dependencies installed for each Python
    in ``sites``: name, content and mode."""
    lib: dict[str, bytes] = {}
    for site in sites:
        for name, data in _installed(site).items():
            # A compiled module's name says its Python. A wheel's own records (its tags, a bill
            # of materials) differ by wheel: the first one's is kept. Any other file that
            # differs would be code one Python would run and another not.
            if name in lib and lib[name] != data and ".dist-info/" not in name:
                raise KrewError(f"{name} differs between Python versions on {platform.name}")
            lib.setdefault(name, data)
    clash = sorted(name for name in _ours() if name in lib)
    if clash:
        raise KrewError(f"a dependency installs files of ours: {', '.join(clash)}")
    lib.update(_ours())
    files = {f"lib/{name}": (data, 0o644) for name, data in lib.items()}
    files[EXECUTABLE] = (LAUNCHER.encode(), 0o755)
    files["LICENSE"] = ((REPO / "LICENSE").read_bytes(), 0o644)
    return files


def archive_name(version: str, platform: Platform) -> str:
    return f"{EXECUTABLE}-v{version}-{platform.name}.tar.gz"


def manifest(version: str, url_base: str, digests: Mapping[str, str]) -> str:
    """The Krew manifest of ``version``: each platform's archive under ``url_base/vVERSION/``,
    with its sha256 (``digests`` by archive name)."""
    platforms = [
        {
            "selector": {"matchLabels": {"os": p.os, "arch": p.arch}},
            "uri": f"{url_base.rstrip('/')}/v{version}/{archive_name(version, p)}",
            "sha256": digests[archive_name(version, p)],
            "files": [
                {"from": EXECUTABLE, "to": "."},
                {"from": "lib", "to": "."},
                {"from": "LICENSE", "to": "."},
            ],
            "bin": EXECUTABLE,
        }
        for p in PLATFORMS
    ]
    plugin = {
        "apiVersion": "krew.googlecontainertools.github.com/v1alpha2",
        "kind": "Plugin",
        "metadata": {"name": PLUGIN},
        "spec": {
            "version": f"v{version}",
            "homepage": HOMEPAGE,
            "shortDescription": "Say what kn-rescheduler did, and what it will do",
            "description": (
                "Reads what kn-rescheduler keeps on workloads and Nodes and says it in "
                "sentences: the status of a workload, why a pod will or will not be moved "
                "(the functions' own decision code on the live pod), the marks on each node, "
                "a replay of the functions' logs, and a cleanup of every mark it leaves. "
                "Read-only unless asked."
            ),
            "caveats": (
                "Needs python3 (3.11 to 3.14) on the PATH. "
                "Start with: kubectl kn-rescheduler --help"
            ),
            "platforms": platforms,
        },
    }
    return yaml.safe_dump(plugin, sort_keys=False)


def plugin_files(version: str, url_base: str = RELEASES) -> dict[str, bytes]:
    """The release's plugin files, by name: an archive per platform and the Krew manifest."""
    with tempfile.TemporaryDirectory() as tmp:
        sites = installed(Path(tmp))
        files = {archive_name(version, p): deterministic_tgz(tree(p, sites[p])) for p in PLATFORMS}
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    files["krew/kn-rescheduler.yaml"] = manifest(version, url_base, digests).encode()
    return files
