"""The files of a release, in one folder, the same bytes every time they are made.

``make release VERSION=x.y.z REGISTRY=ghcr.io/acme/kn-rescheduler`` builds the nine images with
that version (reproducibly: hack/build-image.sh) and runs this, which writes ``dist/``:

- ``kn-rescheduler.yaml``: ``knative/`` as ``kubectl apply -f`` takes it (Knative Serving, the
  webhook); ``kn-rescheduler-policies.yaml``: with the admission policies instead (Kubernetes
  1.36); ``kn-rescheduler-without-serving.yaml``: for Knative Eventing alone. Every image of ours
  is named by the digest of its archive's manifest, as Knative's own releases name theirs.
- ``kn-rescheduler-VERSION.tgz``: the Helm chart, its version and appVersion the release's, its
  values pinned to the same digests.
- ``images/FUNCTION.tar`` and ``images/FUNCTION.spdx.json``: the OCI archives those digests name,
  and their bills of materials. ``skopeo copy --preserve-digests oci-archive:images/F.tar
  docker://REGISTRY/F:VERSION`` pushes one under the digest the manifests name, or refuses.
- ``kubectl-kn_rescheduler-vVERSION-OS-ARCH.tar.gz`` and ``krew/kn-rescheduler.yaml``: the
  kubectl plugin for Linux and macOS, amd64 and arm64, and the Krew manifest naming those
  archives under ``--url`` (dev/tools/krew.py). ``kubectl krew install
  --manifest=krew/kn-rescheduler.yaml --archive=...`` installs one without a download.
- ``SHA256SUMS``: every file above, ``sha256sum -c`` checks them.

Nothing in them depends on the day or the machine: the chart archive is written here with
fixed times, owners and order (``helm package`` stamps each file's time on disk, the
checkout's), the manifests are kustomize's render, the archives and their documents are
reproducible already (tests/e2e/test_image_reproducible.py). tests/e2e/test_release.py makes a
release twice and compares every byte.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import yaml

from dev.stack.functions import FUNCTIONS
from dev.tools import chart, krew
from dev.tools.tgz import deterministic_tgz

REPO: Final = Path(__file__).resolve().parents[2]
# Semantic Versioning 2.0.0, as Helm requires of a chart's version.
SEMVER: Final = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?"
)
REGISTRY: Final = re.compile(r"[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*")
# The release manifests: a name and the chart toggles (components) each renders.
MANIFESTS: Final[Mapping[str, Sequence[str]]] = {
    "kn-rescheduler.yaml": (),
    "kn-rescheduler-policies.yaml": ("policies",),
    "kn-rescheduler-without-serving.yaml": ("withoutServing",),
}


class ReleaseError(RuntimeError):
    """The release cannot be made (the message says what is missing or wrong)."""


def manifest_digest(archive: Path) -> str:
    """The digest of the only manifest of an OCI archive: what a registry stores it under."""
    try:
        with tarfile.open(archive) as tar:
            index = tar.extractfile("index.json")
            if index is None:
                raise ReleaseError(f"{archive}: no index.json")
            manifests = json.load(index)["manifests"]
    except (OSError, tarfile.TarError, KeyError, ValueError) as exc:
        raise ReleaseError(f"{archive}: not an OCI archive: {exc}") from exc
    if len(manifests) != 1:
        raise ReleaseError(f"{archive}: {len(manifests)} manifests, not one")
    digest: str = manifests[0]["digest"]
    return digest


def manifests(kubectl: Path, registry: str, digests: Mapping[str, str]) -> dict[str, bytes]:
    images = {f"kn-rescheduler/{f}": f"{registry}/{f}@{d}" for f, d in digests.items()}
    out = {}
    for name, toggles in MANIFESTS.items():
        combo = tuple(n in toggles for n in chart.NAMES)
        objs = chart.kustomize(combo, kubectl, images)
        out[name] = yaml.safe_dump_all(objs, sort_keys=False).encode()
    return out


def chart_archive(version: str, registry: str, digests: Mapping[str, str]) -> bytes:
    """charts/kn-rescheduler as ``helm package`` packs it, with the release's version and
    digests, every entry's time, owner and mode fixed and the entries in order."""
    files: dict[str, bytes] = {}
    for path in sorted(chart.CHART.rglob("*")):
        if path.is_file():
            files[str(path.relative_to(chart.CHART))] = path.read_bytes()
    meta = files["Chart.yaml"].decode()
    for field in ("version", "appVersion"):
        meta, found = re.subn(rf"(?m)^{field}: .*$", f"{field}: {version}", meta)
        if found != 1:
            raise ReleaseError(f"charts/kn-rescheduler/Chart.yaml: no single {field} line")
    files["Chart.yaml"] = meta.encode()
    values = files["values.yaml"].decode()
    pinned = "".join(f"    {f}: {digests[f]}\n" for f in sorted(digests))
    for old, new in (
        ("  registry: kn-rescheduler\n", f"  registry: {registry}\n"),
        ('  tag: ""\n', f'  tag: "{version}"\n'),
        ("  digests: {}\n", f"  digests:\n{pinned}"),
    ):
        if values.count(old) != 1:
            raise ReleaseError(f"charts/kn-rescheduler/values.yaml: no single {old.strip()!r}")
        values = values.replace(old, new)
    files["values.yaml"] = values.encode()
    return deterministic_tgz({f"kn-rescheduler/{n}": (data, 0o644) for n, data in files.items()})


def _place(source: Path, target: Path) -> None:
    """``source`` at ``target``: a hard link where it can be (the archives are large), else a
    copy."""
    target.unlink(missing_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def release(
    version: str,
    registry: str,
    images_dir: Path,
    out: Path,
    kubectl: Path,
    url: str = krew.RELEASES,
) -> list[str]:
    """Write the release into ``out`` (emptied first); the names written, in order. ``url``
    is where the release's files will be downloaded from (``URL/vVERSION/FILE``), which the
    Krew manifest names."""
    if not SEMVER.fullmatch(version):
        raise ReleaseError(f"VERSION {version!r} is not a semantic version (x.y.z)")
    if not REGISTRY.fullmatch(registry):
        raise ReleaseError(f"REGISTRY {registry!r} is not a repository prefix (host/path)")
    archives = {f: images_dir / f"{f}.tar" for f in FUNCTIONS}
    documents = {f: images_dir / f"{f}.spdx.json" for f in FUNCTIONS}
    absent = [str(p) for p in (*archives.values(), *documents.values()) if not p.is_file()]
    if absent:
        raise ReleaseError(f"missing (make images TAG={version}): {', '.join(absent)}")
    digests = {f: manifest_digest(a) for f, a in archives.items()}
    if out.exists():
        shutil.rmtree(out)
    (out / "images").mkdir(parents=True)
    (out / "krew").mkdir()
    written: dict[str, bytes | Path] = {}
    written.update(manifests(kubectl, registry, digests))
    written[f"kn-rescheduler-{version}.tgz"] = chart_archive(version, registry, digests)
    written.update(krew.plugin_files(version, url))
    for f in FUNCTIONS:
        written[f"images/{f}.tar"] = archives[f]
        written[f"images/{f}.spdx.json"] = documents[f]
    sums = []
    for name in sorted(written):
        content = written[name]
        if isinstance(content, Path):
            _place(content, out / name)
        else:
            (out / name).write_bytes(content)
        sums.append(f"{_sha256(out / name)}  {name}\n")
    (out / "SHA256SUMS").write_text("".join(sums))
    return [*sorted(written), "SHA256SUMS"]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", required=True, help="the release's version, x.y.z")
    parser.add_argument("--registry", required=True, help="where the images will be pushed")
    parser.add_argument("--images", type=Path, default=REPO / ".local" / "images")
    parser.add_argument("--out", type=Path, default=REPO / "dist")
    parser.add_argument(
        "--url", default=krew.RELEASES, help="where the files will be downloaded from (Krew)"
    )
    args = parser.parse_args(argv)
    try:
        names = release(
            args.version, args.registry, args.images, args.out, chart.kubectl(), args.url
        )
    except ReleaseError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 2
    for name in names:
        print(f"{args.out}/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
