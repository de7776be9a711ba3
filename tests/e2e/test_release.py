"""A release made twice is the same bytes, and what it pins is what it ships.

The images are the OCI archives ``make images`` writes (built here first if missing, as
tests/e2e/test_images.py does); the release is made from them twice, into two folders.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from dev.bench import images
from dev.localcluster.bins import ensure_helm
from dev.stack.functions import FUNCTIONS
from dev.tools import chart, krew, release
from tests.e2e.conftest import wait_for
from tests.e2e.knative_manifests import Obj, kubectl

pytestmark = pytest.mark.e2e

VERSION = "1.4.2"
REGISTRY = "ghcr.io/acme/kn-rescheduler"
CHART = f"kn-rescheduler-{VERSION}.tgz"


INPUTS = [f"{f}{suffix}" for f in FUNCTIONS for suffix in (".tar", ".spdx.json")]


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The archives and their documents as they are now, linked into a folder of the test's own.

    `make images` (CI, before `make test`) leaves them in .local/images; built here when absent.
    Other tests rebuild them under another tag while this one runs (an archive is removed, then
    written again), so each is taken once it is there, and the release reads this snapshot.
    """
    if any(not (images.IMAGES_DIR / name).is_file() for name in INPUTS):
        if images.missing_tools():
            pytest.skip(f"no archives and the image tools are missing: {images.missing_tools()}")
        images.build(list(FUNCTIONS))
    snapshot = tmp_path_factory.mktemp("images")

    def taken(name: str) -> bool:
        try:
            os.link(images.IMAGES_DIR / name, snapshot / name)
        except FileNotFoundError:
            return False
        return True

    for name in INPUTS:
        wait_for(f"{name} in {images.IMAGES_DIR} (being rebuilt)", lambda n=name: taken(n), 300)
    return snapshot


@pytest.fixture(scope="module")
def made(archives: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    first = tmp_path_factory.mktemp("release") / "dist"
    second = tmp_path_factory.mktemp("again") / "dist"
    for out in (first, second):
        release.release(VERSION, REGISTRY, archives, out, kubectl())
    return first, second


def files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_a_release_made_twice_is_the_same_bytes(made: tuple[Path, Path]) -> None:
    first, second = files(made[0]), files(made[1])
    assert sorted(first) == sorted(
        [
            *release.MANIFESTS,
            CHART,
            "SHA256SUMS",
            "krew/kn-rescheduler.yaml",
            *(krew.archive_name(VERSION, p) for p in krew.PLATFORMS),
            *(f"images/{f}.tar" for f in FUNCTIONS),
            *(f"images/{f}.spdx.json" for f in FUNCTIONS),
        ]
    )
    different = [name for name in first if first[name] != second[name]]
    assert different == []


def test_every_file_is_in_the_checksums_and_matches(made: tuple[Path, Path]) -> None:
    root = made[0]
    listed = {}
    for line in (root / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ", 1)
        listed[name] = digest
    assert set(listed) == set(files(root)) - {"SHA256SUMS"}
    for name, digest in listed.items():
        assert hashlib.sha256((root / name).read_bytes()).hexdigest() == digest, name


def images_of(objs: list[Obj]) -> set[str]:
    found = set()
    for obj in objs:
        template = (obj.get("spec") or {}).get("template") or {}
        for container in (template.get("spec") or {}).get("containers") or []:
            found.add(container["image"])
    return found


@pytest.mark.parametrize("name", list(release.MANIFESTS))
def test_the_manifests_name_each_image_by_its_archives_digest(
    made: tuple[Path, Path], name: str
) -> None:
    root = made[0]
    objs = [d for d in yaml.safe_load_all((root / name).read_text()) if d]
    ours = {i for i in images_of(objs) if i.startswith(f"{REGISTRY}/")}
    expected = {
        f"{REGISTRY}/{f}@{release.manifest_digest(root / 'images' / f'{f}.tar')}" for f in FUNCTIONS
    }
    # Every image of ours is one of the archives, by digest; the base runs all nine.
    assert ours <= expected and len(ours) >= 8, ours
    assert all("@sha256:" in i for i in images_of(objs)), images_of(objs)


def test_the_packaged_chart_lints_and_installs_the_same_digests(made: tuple[Path, Path]) -> None:
    root = made[0]
    helm = ensure_helm()
    lint = subprocess.run(
        [str(helm), "lint", "--strict", "--namespace", "kn-rescheduler", str(root / CHART)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    done = subprocess.run(
        [
            str(helm),
            "template",
            "kn-rescheduler",
            str(root / CHART),
            "--namespace",
            "kn-rescheduler",
            "--set",
            "admission.mode=webhook",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    objs = [d for d in yaml.safe_load_all(done.stdout) if d]
    base = [d for d in yaml.safe_load_all((root / "kn-rescheduler.yaml").read_text()) if d]
    assert images_of(objs) == images_of(base)
    assert {o["metadata"]["labels"]["app.kubernetes.io/version"] for o in objs} == {VERSION}
    assert {o["metadata"]["labels"]["helm.sh/chart"] for o in objs} == {f"kn-rescheduler-{VERSION}"}


def test_a_version_or_registry_that_is_not_one_is_refused(archives: Path, tmp_path: Path) -> None:
    for version, registry in (("v1", REGISTRY), ("1.2.3", "https://ghcr.io/x")):
        with pytest.raises(release.ReleaseError):
            release.release(version, registry, archives, tmp_path / "dist", kubectl())
    assert not (tmp_path / "dist").exists()


def test_the_chart_in_the_release_is_the_repositorys_with_the_versions_and_digests(
    made: tuple[Path, Path],
) -> None:
    with tarfile.open(made[0] / CHART) as tar:
        names = sorted(m.name for m in tar.getmembers())
        assert {m.mtime for m in tar.getmembers()} == {0}
        meta = yaml.safe_load(member(tar, "kn-rescheduler/Chart.yaml"))
        values = yaml.safe_load(member(tar, "kn-rescheduler/values.yaml"))
    on_disk = sorted(
        f"kn-rescheduler/{p.relative_to(chart.CHART)}"
        for p in chart.CHART.rglob("*")
        if p.is_file()
    )
    assert names == on_disk
    assert (meta["version"], meta["appVersion"]) == (VERSION, VERSION)
    assert values["image"]["registry"] == REGISTRY
    assert set(values["image"]["digests"]) == set(FUNCTIONS)


def member(tar: tarfile.TarFile, name: str) -> bytes:
    extracted = tar.extractfile(name)
    assert extracted is not None, name
    return extracted.read()


def test_the_krew_manifest_names_each_platform_s_archive_by_its_digest(
    made: tuple[Path, Path],
) -> None:
    root = made[0]
    plugin = yaml.safe_load((root / "krew" / "kn-rescheduler.yaml").read_text())
    assert (plugin["kind"], plugin["metadata"]["name"]) == ("Plugin", "kn-rescheduler")
    assert plugin["spec"]["version"] == f"v{VERSION}"
    listed = {
        (p["selector"]["matchLabels"]["os"], p["selector"]["matchLabels"]["arch"]): p
        for p in plugin["spec"]["platforms"]
    }
    assert set(listed) == {(p.os, p.arch) for p in krew.PLATFORMS}
    for platform in krew.PLATFORMS:
        entry = listed[(platform.os, platform.arch)]
        name = krew.archive_name(VERSION, platform)
        assert entry["uri"] == f"{krew.RELEASES}/v{VERSION}/{name}"
        assert entry["sha256"] == hashlib.sha256((root / name).read_bytes()).hexdigest()
        assert entry["bin"] == krew.EXECUTABLE


@pytest.mark.parametrize("platform", krew.PLATFORMS, ids=lambda p: p.name)
def test_each_archive_holds_the_compiled_modules_of_its_platform_for_every_python(
    made: tuple[Path, Path], platform: krew.Platform
) -> None:
    with tarfile.open(made[0] / krew.archive_name(VERSION, platform)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members[krew.EXECUTABLE].mode == 0o755
    assert {m.mtime for m in members.values()} == {0}
    assert "lib/kubectl_kn_rescheduler/cli.py" in members
    assert not [n for n in members if n.endswith(".pyc") or n.endswith("RECORD")]
    # The Kubernetes client needs pydantic-core, which is compiled only: one module per
    # CPython, built for this platform and no other.
    compiled = sorted(n for n in members if n.startswith("lib/pydantic_core/_pydantic_core."))
    tag = (
        "darwin"
        if platform.os == "darwin"
        else ("x86_64" if platform.arch == "amd64" else "aarch64")
    )
    assert len(compiled) == len(krew.PYTHONS), compiled
    for python in krew.PYTHONS:
        [one] = [n for n in compiled if f".cpython-{python.replace('.', '')}-" in n]
        assert tag in one, one
