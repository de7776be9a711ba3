"""The same commit builds the same images, digest for digest (hack/build-image.sh's header says
how, docs/security.md how to check it by hand).

One build is made as ``make images`` makes it, with buildah's layer cache, after a build of
the same function as another version (as on a machine that built an earlier commit: the cache
then holds intermediate images whose configs carry that version). The other is made without
the cache (KNR_NO_CACHE=1), every layer built again, pip installing the lock again, from a copy
of the build's inputs whose files all have other times, as a second clone's would. So a time,
a checkout or the cache's history leaking into the image makes them differ. The base, cached,
is built twice as well, each into a cache of its own, from the Debian mirror.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dev.bench import images
from dev.stack.functions import ROOT

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        bool(images.missing_tools()),
        reason=f"images need {', '.join(images.missing_tools())} (hack/install-packages.sh)",
    ),
    # Two builds without the cache (pip installs the lock each time), or two bases.
    pytest.mark.timeout(900),
]

FUNCTION = "score-nodes"
# Tags of this run only: buildah's cache compares an image's steps, not the flags that made
# it, and would hand back a final image of the same tag that another version of
# hack/build-image.sh made.
TAG = f"reproducible-{uuid.uuid4().hex[:8]}"
EARLIER_TAG = f"{TAG}-earlier"
# What a build reads: the Dockerfile and its context, the script, and the bill of materials'
# tool. A file missing here makes the copy's build fail, not pass.
BUILD_INPUTS = (
    "Dockerfile",
    ".dockerignore",
    "requirements.lock",
    "shared",
    "functions",
    "hack/build-image.sh",
    "dev/__init__.py",
    "dev/tools/__init__.py",
    "dev/tools/sbom.py",
)
A_DAY = 86_400


def build(tree: Path, out: Path, *args: str, tag: str = TAG, cache: bool = True) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("SOURCE_DATE_EPOCH", "KNR_NO_CACHE")}
    env.update({"KNR_IMAGE_TAG": tag, "PYTHON": sys.executable})
    if not cache:
        env["KNR_NO_CACHE"] = "1"
    subprocess.run(
        ["bash", str(tree / "hack" / "build-image.sh"), "--out", str(out), *args],
        cwd=tree,
        env=env,
        check=True,
    )


def manifest_digest(archive: Path) -> str:
    with tarfile.open(archive) as tar:
        index = tar.extractfile("index.json")
        assert index is not None
        (entry,) = json.load(index)["manifests"]
    digest: str = entry["digest"]
    return digest


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def copy_with_other_times(tree: Path) -> None:
    """The build's inputs into ``tree``, every file and directory a day newer than ROOT's."""
    for name in BUILD_INPUTS:
        source, target = ROOT / name, tree / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, target)
    later = time.time() + A_DAY
    for path in [tree, *tree.rglob("*")]:
        os.utime(path, (later, later))


@pytest.fixture
def cleanup_tags() -> Iterator[None]:
    yield
    for tag in (TAG, EARLIER_TAG):
        subprocess.run(
            ["buildah", "rmi", f"localhost/kn-rescheduler/{FUNCTION}:{tag}"],
            capture_output=True,
            check=False,
        )


@pytest.mark.usefixtures("cleanup_tags")
def test_a_function_built_from_the_cache_and_from_another_checkout_is_the_same_image(
    tmp_path: Path,
) -> None:
    tree = tmp_path / "second-checkout"
    copy_with_other_times(tree)
    assert (tree / "Dockerfile").stat().st_mtime - (ROOT / "Dockerfile").stat().st_mtime > 3600

    build(ROOT, tmp_path / "earlier", FUNCTION, tag=EARLIER_TAG)
    build(ROOT, tmp_path / "first", FUNCTION)
    build(tree, tmp_path / "second", FUNCTION, cache=False)

    first, second = (tmp_path / d / f"{FUNCTION}.tar" for d in ("first", "second"))
    assert manifest_digest(first) == manifest_digest(second)
    # The archive itself too, byte for byte: what a registry stores and a node pulls.
    assert sha256(first) == sha256(second)
    # And its bill of materials, which names that digest.
    documents = [
        json.loads((tmp_path / d / f"{FUNCTION}.spdx.json").read_text())
        for d in ("first", "second")
    ]
    assert documents[0] == documents[1]
    image = documents[0]["packages"][0]
    assert image["checksums"][0]["checksumValue"] == manifest_digest(first).removeprefix("sha256:")


# Two Debian bases from the mirror cost minutes that `make test` does not spend on every run:
# `make images-reproducible` runs this test too.
@pytest.mark.skipif(
    os.environ.get("KN_RESCHEDULER_IMAGES") != "full",
    reason="the base built twice from the Debian mirror: make images-reproducible",
)
def test_the_base_built_twice_is_the_same_image(tmp_path: Path) -> None:
    archives = []
    for cache in ("first", "second"):
        out = subprocess.run(
            ["bash", str(ROOT / "hack" / "build-image.sh"), "--base"],
            cwd=ROOT,
            env={**os.environ, "KN_RESCHEDULER_CACHE": str(tmp_path / cache)},
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        archives.append(Path(out.strip().splitlines()[-1]))
    assert archives[0] != archives[1]  # two builds, not one cached archive read twice
    assert manifest_digest(archives[0]) == manifest_digest(archives[1])
