"""The real nodes' images and the registry they pull from, with the real tools: the pause and
busybox archives hack/build-node-images.sh makes (cached after the first run), pushed into a
LocalRegistry (Debian's docker-registry) and read back over the registry API with skopeo.

No container runs here: that the binaries inside run on ``scratch`` is checked by reading their
ELF headers from the archives' layers (statically linked: no program interpreter).
"""

from __future__ import annotations

import gzip
import io
import json
import shutil
import socket
import struct
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from dev.localcluster import nodeimages
from dev.localcluster.procs import pid_alive
from dev.localcluster.registry import LocalRegistry

TOOLS = ("buildah", "skopeo", "gcc", "docker-registry", "busybox")
MISSING = [t for t in TOOLS if shutil.which(t) is None]

# With the real-node files: they build and read the same node images on this machine.
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.real_nodes,
    pytest.mark.skipif(
        bool(MISSING), reason=f"node images need {', '.join(MISSING)} (hack/install-packages.sh)"
    ),
]

# The applets a test pod's command may use; the image links every applet busybox has.
APPLETS = ("sh", "sleep", "cat", "echo", "test", "ls", "true", "false", "date", "wget", "dd")
PT_INTERP = 3


@pytest.fixture(scope="module")
def images() -> Path:
    return nodeimages.ensure_node_images()


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    work = tmp_path_factory.mktemp("registry")
    reg = LocalRegistry(work / "registry", work / "logs")
    proc = reg.start(time.monotonic() + 30.0)
    try:
        yield reg
    finally:
        reg.stop()
        assert not pid_alive(proc.pid), "the registry outlived stop()"


@pytest.fixture(scope="module")
def pushed(images: Path, registry: LocalRegistry) -> dict[str, str]:
    return nodeimages.push_node_images(registry, images)


def skopeo_inspect(reference: str, *, config: bool = False) -> dict[str, Any]:
    argv = ["skopeo", "inspect", "--tls-verify=false"]
    if config:
        argv.append("--config")
    done = subprocess.run(
        [*argv, f"docker://{reference}"], capture_output=True, text=True, timeout=60, check=True
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


class OciArchive:
    """An OCI archive (``oci-archive:``) holding one image, read with tarfile."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.index = self.json("index.json")
        (self.descriptor,) = self.index["manifests"]
        self.manifest = self.json(self.blob_path(self.descriptor["digest"]))

    @staticmethod
    def blob_path(digest: str) -> str:
        algorithm, hex_digest = digest.split(":", 1)
        return f"blobs/{algorithm}/{hex_digest}"

    def read(self, member: str) -> bytes:
        with tarfile.open(self.path) as tar:
            f = tar.extractfile(member)
            assert f is not None, f"{member} is not a file in {self.path}"
            return f.read()

    def json(self, member: str) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.read(member))
        return result

    def ref_name(self) -> str:
        return str(self.descriptor["annotations"]["org.opencontainers.image.ref.name"])

    def layer(self) -> tarfile.TarFile:
        """The image's one layer, uncompressed in memory."""
        (layer,) = self.manifest["layers"]
        assert layer["mediaType"].endswith("tar+gzip"), layer["mediaType"]
        raw = gzip.decompress(self.read(self.blob_path(layer["digest"])))
        return tarfile.open(fileobj=io.BytesIO(raw))

    def layer_members(self) -> dict[str, tarfile.TarInfo]:
        """Path (without a leading ./ or /) -> the layer's entry."""
        with self.layer() as tar:
            return {m.name.lstrip("./"): m for m in tar.getmembers()}

    def layer_file(self, name: str) -> bytes:
        with self.layer() as tar:
            f = tar.extractfile(name)
            assert f is not None, f"{name} is not a file in {self.path}'s layer"
            return f.read()


def program_header_types(elf: bytes) -> list[int]:
    """The p_type of every program header of a 64-bit little-endian ELF executable."""
    assert elf[:4] == b"\x7fELF", "not an ELF file"
    assert elf[4] == 2 and elf[5] == 1, "not a 64-bit little-endian ELF"
    (phoff,) = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    return [struct.unpack_from("<I", elf, phoff + i * phentsize)[0] for i in range(phnum)]


def test_archives_are_named_as_the_nodes_refer_to_them(images: Path) -> None:
    assert OciArchive(images / nodeimages.PAUSE_ARCHIVE).ref_name() == nodeimages.PAUSE_IMAGE
    assert OciArchive(images / nodeimages.BUSYBOX_ARCHIVE).ref_name() == nodeimages.BUSYBOX_IMAGE
    # CoreDNS by the name Kubernetes' add-on manifest gives it, which is copied beside it.
    coredns = OciArchive(images / nodeimages.COREDNS_ARCHIVE).ref_name()
    assert coredns == f"{nodeimages.UPSTREAM_HOST}/{nodeimages.COREDNS_NAME}"
    assert f"image: {coredns}\n" in (images / "coredns.yaml").read_text()


def test_coredns_is_a_static_binary_with_the_corefiles_plugins(images: Path) -> None:
    archive = OciArchive(images / nodeimages.COREDNS_ARCHIVE)
    assert PT_INTERP not in program_header_types(archive.layer_file("coredns"))
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "coredns"
        binary.write_bytes(archive.layer_file("coredns"))
        binary.chmod(0o755)
        plugins = subprocess.run(
            [str(binary), "-plugins"], capture_output=True, text=True, check=True
        ).stdout.split()
        version = subprocess.run(
            [str(binary), "-version"], capture_output=True, text=True, check=True
        ).stdout
    # The Corefile's directives: the lines one level inside its server block (`.:53 {`).
    corefile = (images / "coredns.yaml").read_text().split("Corefile: |", 1)[1].split("---")[0]
    lines = [line for line in corefile.splitlines() if line.strip()]
    depth = len(lines[1]) - len(lines[1].lstrip())
    inside = [x for x in lines[1:] if len(x) - len(x.lstrip()) == depth]
    used = {x.split()[0] for x in inside if x.strip() != "}"}
    assert {"kubernetes", "forward", "cache", "loop", "health", "ready"} <= used
    assert used <= set(plugins)
    assert f"CoreDNS-{nodeimages.COREDNS_NAME.rsplit(':v', 1)[1]}" in version


def test_a_second_build_is_the_cache(images: Path) -> None:
    started = time.monotonic()
    assert nodeimages.ensure_node_images() == images
    assert time.monotonic() - started < 5.0


def test_pause_is_upstreams_static_pause_as_user_65535(
    registry: LocalRegistry, pushed: dict[str, str]
) -> None:
    reference = pushed[nodeimages.PAUSE_IMAGE]
    assert reference == f"{registry.host}/{nodeimages.PAUSE_NAME}"
    cfg = skopeo_inspect(reference, config=True)["config"]
    assert cfg["Entrypoint"] == ["/pause"]
    assert cfg["User"] == "65535:65535"
    assert not cfg.get("Cmd")


def test_busybox_runs_sh_by_default(registry: LocalRegistry, pushed: dict[str, str]) -> None:
    reference = pushed[nodeimages.BUSYBOX_IMAGE]
    assert reference == f"{registry.host}/{nodeimages.BUSYBOX_NAME}"
    cfg = skopeo_inspect(reference, config=True)["config"]
    assert cfg["Cmd"] == ["sh"]
    assert not cfg.get("Entrypoint")
    assert any(e.startswith("PATH=") and "/bin" in e.split(":") for e in cfg["Env"])


def test_the_registry_serves_the_archives_unchanged(
    images: Path, registry: LocalRegistry, pushed: dict[str, str]
) -> None:
    for archive, (_, name) in nodeimages.ARCHIVES.items():
        digest = OciArchive(images / archive).descriptor["digest"]
        assert skopeo_inspect(registry.reference(name))["Digest"] == digest, archive
    http = requests.Session()
    http.trust_env = False
    catalog = http.get(f"{registry.url}/v2/_catalog", timeout=5).json()
    assert sorted(catalog["repositories"]) == ["busybox", "coredns/coredns", "pause"]


def test_the_binaries_are_statically_linked(images: Path) -> None:
    pause = OciArchive(images / nodeimages.PAUSE_ARCHIVE)
    busybox = OciArchive(images / nodeimages.BUSYBOX_ARCHIVE)
    for archive, path in ((pause, "pause"), (busybox, "bin/busybox")):
        types = program_header_types(archive.layer_file(path))
        assert types, f"{path}: no program headers"
        assert PT_INTERP not in types, f"{path} is dynamically linked"
    members = pause.layer_members()
    assert members["pause"].mode & 0o111


def test_busybox_links_its_applets(images: Path) -> None:
    members = OciArchive(images / nodeimages.BUSYBOX_ARCHIVE).layer_members()
    assert members["bin/busybox"].isfile() and members["bin/busybox"].mode & 0o111
    for applet in APPLETS:
        link = next(
            (members[d + applet] for d in ("bin/", "usr/bin/") if d + applet in members), None
        )
        assert link is not None, f"no {applet} in /bin or /usr/bin"
        assert link.issym() and link.linkname == "/bin/busybox", f"{applet} -> {link.linkname}"
    assert members["tmp"].isdir() and members["tmp"].mode & 0o1777 == 0o1777


def test_stop_frees_the_port_and_start_keeps_the_images(tmp_path: Path, images: Path) -> None:
    reg = LocalRegistry(tmp_path / "registry", tmp_path / "logs")
    first = reg.start(time.monotonic() + 30.0)
    try:
        reg.push(images / nodeimages.BUSYBOX_ARCHIVE, nodeimages.BUSYBOX_NAME)
        reg.stop()
        assert not pid_alive(first.pid)
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", reg.port)) != 0, "the port still answers"
        reg.start(time.monotonic() + 30.0)
        assert skopeo_inspect(reg.reference(nodeimages.BUSYBOX_NAME))["Digest"]
    finally:
        reg.stop()
