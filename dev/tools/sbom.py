"""The bill of materials of a function's image (SPDX 2.3, JSON), read from the image itself.

A scanner matching advisories, or a reviewer asking "what runs there", needs to know what an
image holds, not what its recipe asked for: the Debian base comes from a mirror on the day it
was made, and pip installs what the index serves for the lock's pins. So this reads the OCI
archive ``make images`` writes (hack/build-image.sh runs it beside every archive it writes,
``.local/images/<function>.spdx.json``):

- the Debian packages dpkg recorded as installed in the image (``var/lib/dpkg/status``), each
  with its version, architecture, source package and package URL (``pkg:deb/debian/...``);
- the Python distributions of its site-packages (each ``*.dist-info/METADATA``), with their
  package URL (``pkg:pypi/...``), their declared licence when it is an SPDX expression, and the
  sha256 hashes requirements.lock allowed for them: pip checked the installed file against
  those, so a single hash is that file's checksum;
- the image itself, named by its manifest digest: what a registry and a pod spec name.

The layers are read in order, whiteouts applied, as a container runtime stacks them. The
document carries the image's own creation time and a namespace made from its digest, so one
image always gets the same document, byte for byte, as the image itself is reproducible.

    python -m dev.tools.sbom .local/images/detect-failures.tar     writes detect-failures.spdx.json
"""

from __future__ import annotations

import argparse
import email.parser
import json
import re
import sys
import tarfile
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Final, NotRequired, TypedDict

ROOT: Final = Path(__file__).resolve().parents[2]
DPKG_STATUS: Final = "var/lib/dpkg/status"
# etc/os-release is a symlink to this on Debian; an image without it is read as plain Debian.
OS_RELEASE: Final = ("usr/lib/os-release", "etc/os-release")
METADATA: Final = re.compile(r"(?:^|/)(?:site|dist)-packages/[^/]+\.dist-info/METADATA$")
WHITEOUT: Final = ".wh."
OPAQUE: Final = ".wh..wh..opq"
TOOL: Final = "Tool: kn-rescheduler-sbom (dev/tools/sbom.py)"
NAMESPACE: Final = "https://kn-rescheduler.io/spdx"


@dataclass(frozen=True)
class DebPackage:
    """One package of dpkg's status file, as installed."""

    name: str
    version: str
    architecture: str
    source: str
    source_version: str


@dataclass(frozen=True)
class PythonDist:
    """One installed distribution, from its METADATA."""

    name: str
    version: str
    # PEP 639's License-Expression (an SPDX expression by definition), or "".
    license_expression: str = ""


@dataclass(frozen=True)
class Locked:
    """A pin of requirements.lock: the version, and the sha256 of every file it allows."""

    version: str
    hashes: tuple[str, ...]


@dataclass(frozen=True)
class Distro:
    """The image's operating system, as package URLs name it (pkg:deb/<id>/...?distro=...)."""

    id: str
    version_id: str

    @property
    def qualifier(self) -> str:
        return f"{self.id}-{self.version_id}" if self.version_id else self.id


@dataclass(frozen=True)
class Image:
    """The image the document describes."""

    name: str
    tag: str
    digest: str
    created: str


# The document's JSON, in SPDX 2.3's own field names.
class Checksum(TypedDict):
    algorithm: str
    checksumValue: str


class ExternalRef(TypedDict):
    referenceCategory: str
    referenceType: str
    referenceLocator: str


class SpdxPackage(TypedDict):
    SPDXID: str
    name: str
    versionInfo: str
    downloadLocation: str
    filesAnalyzed: bool
    licenseConcluded: str
    licenseDeclared: str
    copyrightText: str
    externalRefs: list[ExternalRef]
    primaryPackagePurpose: NotRequired[str]
    checksums: NotRequired[list[Checksum]]
    sourceInfo: NotRequired[str]
    comment: NotRequired[str]


class Relationship(TypedDict):
    spdxElementId: str
    relationshipType: str
    relatedSpdxElement: str


class CreationInfo(TypedDict):
    created: str
    creators: list[str]


class SpdxDocument(TypedDict):
    spdxVersion: str
    dataLicense: str
    SPDXID: str
    name: str
    documentNamespace: str
    creationInfo: CreationInfo
    packages: list[SpdxPackage]
    relationships: list[Relationship]


# -- reading what dpkg and pip wrote (pure) -----------------------------------------------------


def control_paragraphs(text: str) -> Iterator[dict[str, str]]:
    """The paragraphs of a Debian control file (dpkg's status is one): field -> value, a
    folded field's continuation lines joined with newlines (pure)."""
    fields: dict[str, str] = {}
    last = ""
    for line in text.splitlines():
        if not line.strip():
            if fields:
                yield fields
            fields, last = {}, ""
        elif line[0] in " \t":
            if last:
                fields[last] += "\n" + line.strip()
        elif ":" in line:
            last, value = line.split(":", 1)
            fields[last] = value.strip()
    if fields:
        yield fields


def parse_dpkg_status(text: str) -> tuple[DebPackage, ...]:
    """The packages dpkg's status file says are installed, by name and architecture (pure).

    A package removed but for its configuration files, or half unpacked, has a paragraph too:
    only the state "installed" counts. ``Source`` names the source package, with its own
    version in parentheses when that differs from the binary's (a binary rebuild)."""
    found = []
    for fields in control_paragraphs(text):
        state = fields.get("Status", "").split()
        if len(state) != 3 or state[2] != "installed" or "Package" not in fields:
            continue
        version = fields.get("Version", "")
        source, _, source_version = fields.get("Source", fields["Package"]).partition(" ")
        found.append(
            DebPackage(
                name=fields["Package"],
                version=version,
                architecture=fields.get("Architecture", ""),
                source=source,
                source_version=source_version.strip("()") or version,
            )
        )
    return tuple(sorted(found, key=lambda p: (p.name, p.architecture)))


def parse_metadata(text: str) -> PythonDist:
    """A distribution's name and version from its METADATA (core metadata, RFC 822 headers;
    pure). ValueError when either is missing."""
    headers = email.parser.HeaderParser().parsestr(text)
    name, version = headers.get("Name", "").strip(), headers.get("Version", "").strip()
    if not name or not version:
        raise ValueError("METADATA without Name or Version")
    return PythonDist(name, version, headers.get("License-Expression", "").strip())


def parse_os_release(text: str) -> Distro:
    """ID and VERSION_ID of an os-release file (pure)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.startswith("#"):
            values[key.strip()] = value.strip().strip("\"'")
    return Distro(values.get("ID", "debian"), values.get("VERSION_ID", ""))


def canonical_name(name: str) -> str:
    """PEP 503's normalized form of a distribution name (pure)."""
    return re.sub(r"[-_.]+", "-", name).lower()


PIN: Final = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.\-]*)==([^\s\\;]+)")
HASH: Final = re.compile(r"--hash=sha256:([0-9a-f]{64})")


def parse_lock(text: str) -> dict[str, Locked]:
    """requirements.lock as pip-compile writes it: canonical name -> its pin (pure)."""
    pins: dict[str, tuple[str, list[str]]] = {}
    current = ""
    for line in text.splitlines():
        if matched := PIN.match(line):
            current = canonical_name(matched.group(1))
            pins[current] = (matched.group(2), [])
        elif line.startswith((" ", "\t")) and current:
            pins[current][1].extend(HASH.findall(line))
        else:
            current = ""
    return {name: Locked(version, tuple(hashes)) for name, (version, hashes) in pins.items()}


def is_wanted(path: str) -> bool:
    """Whether a file of the image is one the document is read from (pure)."""
    return path == DPKG_STATUS or path in OS_RELEASE or METADATA.search(path) is not None


def clean_path(name: str) -> str:
    """A layer entry's path as the image's root sees it, without ./ or / in front (pure)."""
    return name.removeprefix("./").lstrip("/")


def apply_layer(files: Mapping[str, bytes], layer: Iterable[tuple[str, bytes]]) -> dict[str, bytes]:
    """The wanted files once one more layer is stacked on ``files`` (pure).

    ``layer`` yields the layer's wanted files and its whiteouts, in the layer's order: a
    ``.wh.NAME`` entry removes NAME (a file, or a directory and all under it) from the layers
    below, ``.wh..wh..opq`` empties its directory of what the layers below put there."""
    below = dict(files)
    added: dict[str, bytes] = {}
    for path, content in layer:
        directory, _, base = path.rpartition("/")
        prefix = f"{directory}/" if directory else ""
        if base == OPAQUE:
            below = {p: c for p, c in below.items() if not p.startswith(prefix)}
        elif base.startswith(WHITEOUT):
            gone = prefix + base.removeprefix(WHITEOUT)
            below = {p: c for p, c in below.items() if p != gone and not p.startswith(gone + "/")}
        else:
            added[path] = content
    return {**below, **added}


# -- the document (pure) ------------------------------------------------------------------------


def purl_deb(package: DebPackage, distro: Distro) -> str:
    version = urllib.parse.quote(package.version, safe="")
    query = urllib.parse.urlencode({"arch": package.architecture, "distro": distro.qualifier})
    return f"pkg:deb/{distro.id}/{urllib.parse.quote(package.name, safe='')}@{version}?{query}"


def purl_pypi(dist: PythonDist) -> str:
    # The purl spec's pypi names: lowercase, '_' as '-'.
    name = urllib.parse.quote(canonical_name(dist.name), safe="")
    return f"pkg:pypi/{name}@{urllib.parse.quote(dist.version, safe='')}"


def purl_oci(image: Image) -> str:
    name = urllib.parse.quote(image.name.rsplit("/", 1)[-1], safe="")
    digest = urllib.parse.quote(image.digest, safe="")
    query = f"?{urllib.parse.urlencode({'tag': image.tag})}" if image.tag else ""
    return f"pkg:oci/{name}@{digest}{query}"


def spdx_ids(prefix: str, names: Sequence[str]) -> list[str]:
    """One SPDX identifier per name, unique, of the letters, digits, '.' and '-' SPDX allows
    (pure): anything else becomes '-', and a name that then collides gets a number."""
    taken: set[str] = set()
    ids = []
    for name in names:
        base = f"SPDXRef-{prefix}-" + re.sub(r"[^A-Za-z0-9.-]", "-", name)
        candidate, n = base, 1
        while candidate in taken:
            n += 1
            candidate = f"{base}-{n}"
        taken.add(candidate)
        ids.append(candidate)
    return ids


def _purl_ref(purl: str) -> list[ExternalRef]:
    return [
        {"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl", "referenceLocator": purl}
    ]


def _package(spdx_id: str, name: str, version: str, purl: str, license_: str) -> SpdxPackage:
    return {
        "SPDXID": spdx_id,
        "name": name,
        "versionInfo": version,
        "downloadLocation": "NOASSERTION",
        "filesAnalyzed": False,
        "licenseConcluded": "NOASSERTION",
        "licenseDeclared": license_ or "NOASSERTION",
        "copyrightText": "NOASSERTION",
        "externalRefs": _purl_ref(purl),
    }


def deb_package(spdx_id: str, package: DebPackage, distro: Distro) -> SpdxPackage:
    spdx = _package(spdx_id, package.name, package.version, purl_deb(package, distro), "")
    spdx["sourceInfo"] = (
        f"built from the {distro.id} source package {package.source} {package.source_version}"
    )
    return spdx


def python_package(spdx_id: str, dist: PythonDist, locked: Locked | None) -> SpdxPackage:
    spdx = _package(spdx_id, dist.name, dist.version, purl_pypi(dist), dist.license_expression)
    if locked is not None and locked.version == dist.version and locked.hashes:
        if len(locked.hashes) == 1:
            # pip refuses any other file: this is the checksum of the one it installed.
            spdx["checksums"] = [{"algorithm": "SHA256", "checksumValue": locked.hashes[0]}]
        spdx["comment"] = (
            "installed by pip --require-hashes from requirements.lock, which allows the "
            "files with sha256 " + ", ".join(locked.hashes)
        )
    return spdx


def document(
    image: Image,
    distro: Distro,
    debs: Sequence[DebPackage],
    dists: Sequence[PythonDist],
    lock: Mapping[str, Locked],
) -> SpdxDocument:
    """The SPDX 2.3 document of ``image``: the image, and every package it contains (pure)."""
    debs = sorted(debs, key=lambda p: (p.name, p.architecture))
    dists = sorted(dists, key=lambda d: (canonical_name(d.name), d.version))
    image_id = "SPDXRef-Image"
    packages: list[SpdxPackage] = [
        {
            **_package(image_id, image.name, image.tag, purl_oci(image), ""),
            "primaryPackagePurpose": "CONTAINER",
            "checksums": [
                {"algorithm": "SHA256", "checksumValue": image.digest.removeprefix("sha256:")}
            ],
        }
    ]
    deb_ids = spdx_ids("deb", [f"{p.name}-{p.architecture}" for p in debs])
    packages += [deb_package(i, p, distro) for i, p in zip(deb_ids, debs, strict=True)]
    pypi_ids = spdx_ids("pypi", [canonical_name(d.name) for d in dists])
    packages += [
        python_package(i, d, lock.get(canonical_name(d.name)))
        for i, d in zip(pypi_ids, dists, strict=True)
    ]
    relationships: list[Relationship] = [
        {
            "spdxElementId": "SPDXRef-DOCUMENT",
            "relationshipType": "DESCRIBES",
            "relatedSpdxElement": image_id,
        }
    ]
    relationships += [
        {"spdxElementId": image_id, "relationshipType": "CONTAINS", "relatedSpdxElement": p}
        for p in (*deb_ids, *pypi_ids)
    ]
    reference = f"{image.name}:{image.tag}" if image.tag else image.name
    return {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": reference,
        "documentNamespace": f"{NAMESPACE}/{image.name}/{image.digest.replace(':', '-')}",
        "creationInfo": {"created": image.created, "creators": [TOOL]},
        "packages": packages,
        "relationships": relationships,
    }


def spdx_time(created: str) -> str:
    """An OCI config's creation time (RFC 3339, maybe with fractions or an offset) as SPDX
    writes times: UTC, to the second, with a Z (pure)."""
    moment = datetime.fromisoformat(created.replace("Z", "+00:00"))
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- the archive --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Contents:
    """What the document is made from, as read from an image's archive."""

    image: Image
    files: Mapping[str, bytes]


def _layer_entries(layer: tarfile.TarFile) -> Iterator[tuple[str, bytes]]:
    for member in layer:
        path = clean_path(member.name)
        base = path.rpartition("/")[2]
        if base.startswith(WHITEOUT):
            yield path, b""
        elif member.isfile() and is_wanted(path):
            extracted = layer.extractfile(member)
            if extracted is not None:
                yield path, extracted.read()


def read_archive(path: Path) -> Contents:
    """The image of an OCI archive (its only manifest) and its wanted files, layers stacked."""
    with tarfile.open(path) as archive:

        def blob(digest: str) -> IO[bytes]:
            algorithm, hexa = digest.split(":", 1)
            member = archive.extractfile(f"blobs/{algorithm}/{hexa}")
            if member is None:
                raise ValueError(f"{path}: no blob {digest}")
            return member

        index_file = archive.extractfile("index.json")
        if index_file is None:
            raise ValueError(f"{path}: no index.json")
        (entry,) = json.load(index_file)["manifests"]
        manifest: dict[str, Any] = json.load(blob(entry["digest"]))
        config: dict[str, Any] = json.load(blob(manifest["config"]["digest"]))
        reference = entry.get("annotations", {}).get("org.opencontainers.image.ref.name", "")
        name, tag = reference, ""
        if ":" in reference.rpartition("/")[2]:
            name, _, tag = reference.rpartition(":")
        files: dict[str, bytes] = {}
        for layer in manifest["layers"]:
            # Streamed: a layer is decompressed once, front to back.
            with tarfile.open(fileobj=blob(layer["digest"]), mode="r|*") as stream:
                files = apply_layer(files, _layer_entries(stream))
    image = Image(
        name, tag, entry["digest"], spdx_time(config.get("created", "1970-01-01T00:00:00Z"))
    )
    return Contents(image, files)


def sbom(contents: Contents, lock: Mapping[str, Locked]) -> SpdxDocument:
    """The document of an archive's contents (pure)."""
    files = contents.files
    os_release = next((files[p] for p in OS_RELEASE if p in files), b"")
    distro = parse_os_release(os_release.decode("utf-8", "replace"))
    debs = parse_dpkg_status(files.get(DPKG_STATUS, b"").decode("utf-8", "replace"))
    dists = [
        parse_metadata(content.decode("utf-8", "replace"))
        for path, content in sorted(files.items())
        if METADATA.search(path)
    ]
    return document(contents.image, distro, debs, dists, lock)


def sbom_path(archive: Path) -> Path:
    """Where an archive's document goes: beside it, .tar replaced by .spdx.json."""
    return archive.with_name(archive.name.removesuffix(".tar") + ".spdx.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("archives", nargs="+", type=Path, help="OCI archives (make images)")
    parser.add_argument(
        "--lock",
        type=Path,
        default=ROOT / "requirements.lock",
        help="the hashed lock the images installed (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    lock = parse_lock(args.lock.read_text()) if args.lock.is_file() else {}
    for archive in args.archives:
        try:
            spdx = sbom(read_archive(archive), lock)
        except (OSError, ValueError, KeyError, tarfile.TarError) as exc:
            print(f"sbom: {archive}: {exc}", file=sys.stderr)
            return 1
        out = sbom_path(archive)
        partial = out.with_name(out.name + ".partial")
        partial.write_text(json.dumps(spdx, indent=2) + "\n")
        partial.replace(out)
        print(f"{out}: {len(spdx['packages']) - 1} packages of {spdx['name']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
