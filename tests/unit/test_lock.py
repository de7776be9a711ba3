"""requirements.lock: what the images install, pinned and hashed, and true to requirements.txt;
and the stock base they are built on otherwise, by digest.

The Dockerfile installs the lock with ``--require-hashes --no-deps``: a package missing from it
fails the build, a file whose hash it does not list is refused. These checks catch the lock
falling behind requirements.txt (``make lock`` writes it again).
"""

from __future__ import annotations

import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==([^\s\\]+)")


def requirements() -> list[Requirement]:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    return [Requirement(line) for line in (x.strip() for x in lines) if line and line[0] != "#"]


def locked() -> dict[str, tuple[str, list[str]]]:
    """Package name -> (pinned version, its hashes)."""
    pins: dict[str, tuple[str, list[str]]] = {}
    current = ""
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        matched = PIN.match(line)
        if matched:
            current = canonicalize_name(matched.group(1))
            pins[current] = (matched.group(2), [])
        elif "--hash=sha256:" in line and current:
            pins[current][1].append(line.split("--hash=sha256:")[1].strip(" \\"))
    return pins


def test_every_requirement_is_locked_at_a_version_it_allows() -> None:
    pins = locked()
    for requirement in requirements():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is not in requirements.lock: run make lock"
        version, _ = pins[name]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"requirements.lock pins {name}=={version}, requirements.txt asks {requirement}: "
            "run make lock"
        )


def test_every_locked_package_has_its_hashes() -> None:
    pins = locked()
    assert len(pins) > len(requirements())  # the transitive packages too
    for name, (version, hashes) in pins.items():
        assert hashes, f"{name}=={version} has no hash"
        assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), name


def test_the_images_install_the_lock_and_nothing_else() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    installs = [line.strip() for line in dockerfile.splitlines() if "pip install" in line]
    # SOURCE_DATE_EPOCH: hash-checked byte code, the same in every build (hack/build-image.sh).
    assert installs == [
        "SOURCE_DATE_EPOCH=0 pip install --no-cache-dir --require-hashes --no-deps "
        "-r requirements.lock"
    ]
    assert "--find-links" not in (ROOT / "requirements.lock").read_text()


def test_the_stock_base_is_named_by_digest() -> None:
    # docker builds start from it (hack/build-image.sh passes its own Debian base instead).
    dockerfile = (ROOT / "Dockerfile").read_text()
    (default,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", dockerfile, flags=re.MULTILINE)
    assert re.fullmatch(r"python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", default), default
