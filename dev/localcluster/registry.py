"""A local image registry the real nodes pull from: no registry on the internet is reachable.

The real nodes (kubelet + containerd) pull images the way a production node does, over the
registry API, rather than having them imported into containerd's store: a pull, its progress
and its failures are part of what a pod's start looks like. The registry is Debian's
``docker-registry`` (the CNCF distribution registry, 2.8), or any ``registry`` binary named by
``KN_RESCHEDULER_REGISTRY``, serving plain HTTP with no auth on a free port of 127.0.0.1, or
of a real-node cluster's gateway, which its nodes reach; its storage and configuration live
under a directory of the cluster's. Images are put into it with
``skopeo copy`` from the OCI archives hack/build-node-images.sh makes
(:mod:`localcluster.nodeimages`).

The process runs like the control plane's (:mod:`localcluster.procs`): its own process group,
killed by the kernel if the harness dies, logged to ``logs/registry.log``, on a port chosen
once, so a ``stop``/``start`` keeps the address (and the images: the storage stays).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
from pathlib import Path
from typing import Any, Final

import requests
import yaml

from dev.localcluster.procs import Proc, free_ports

# Names the registry binary to run instead of Debian's docker-registry.
ENV_REGISTRY: Final = "KN_RESCHEDULER_REGISTRY"
PROCESS_NAME: Final = "registry"
# Copying an image of a few MB over loopback takes a second; this is for a loaded machine.
PUSH_TIMEOUT: Final = 300.0
INSTALL_HINT: Final = (
    "the real nodes pull from a local registry: install Debian's package "
    "(apt-get install --no-install-recommends docker-registry, or hack/install-packages.sh), "
    f"or set {ENV_REGISTRY} to a registry binary"
)


class RegistryError(RuntimeError):
    """The registry is missing, did not start, or refused an image (the message says why)."""


def find_binary() -> str:
    """The registry binary: ``$KN_RESCHEDULER_REGISTRY``, else ``docker-registry`` (Debian's
    name) or ``registry`` (upstream's) on PATH."""
    override = os.environ.get(ENV_REGISTRY)
    found = override or shutil.which("docker-registry") or shutil.which("registry")
    if not found or not os.access(found, os.X_OK):
        raise RegistryError(f"no registry binary found; {INSTALL_HINT}")
    return found


def config(storage_dir: Path, port: int, host: str = "127.0.0.1") -> dict[str, Any]:
    """The registry's configuration: filesystem storage under ``storage_dir``, plain HTTP on
    ``host``:``port``, no auth."""
    return {
        "version": 0.1,
        "log": {"level": "info", "fields": {"service": PROCESS_NAME}},
        "storage": {
            "filesystem": {"rootdirectory": str(storage_dir)},
            "cache": {"blobdescriptor": "inmemory"},
            "delete": {"enabled": True},
            # The upload purger sweeps every 24 h from the start; a test run never needs it.
            "maintenance": {"uploadpurging": {"enabled": False}},
        },
        "http": {
            "addr": f"{host}:{port}",
            # Without one it logs a warning at every start and makes one up; with one registry
            # process there is nothing to share it with.
            "secret": "kn-rescheduler-local",
        },
    }


class LocalRegistry:
    """One registry: configuration and storage under ``directory``, log in ``log_dir``."""

    def __init__(
        self,
        directory: Path,
        log_dir: Path,
        *,
        port: int | None = None,
        binary: str | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        """``port``: None picks a free one now; it stays the registry's across restarts.
        ``host``: the address it listens on (a real-node cluster's gateway, which its nodes
        reach; loopback otherwise)."""
        self.directory = directory
        self.bind_host = host
        self.log_path = log_dir / f"{PROCESS_NAME}.log"
        self.port = port if port is not None else free_ports(1)[0]
        self.binary = binary
        self.config_file = directory / "config.yml"
        self.storage_dir = directory / "storage"
        self.proc: Proc | None = None
        self._http = requests.Session()
        self._http.trust_env = False  # a local address: no proxy

    @property
    def host(self) -> str:
        """``HOST:PORT``, the registry part of an image reference."""
        return f"{self.bind_host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def reference(self, name: str) -> str:
        """The full reference of ``name`` (``busybox:1.35``) in this registry."""
        return f"{self.host}/{name}"

    def start(self, deadline: float) -> Proc:
        """Writes the configuration, starts the process and returns once ``GET /v2/`` answers
        200. Images pushed before a ``stop`` are still there. Like every Proc, it dies with the
        thread that calls this."""
        if self.proc is not None and self.proc.alive():
            return self.proc
        binary = self.binary or find_binary()
        self.storage_dir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(
            yaml.safe_dump(config(self.storage_dir, self.port, self.bind_host), sort_keys=False)
        )
        self.proc = Proc(PROCESS_NAME, [binary, "serve", str(self.config_file)], self.log_path)
        while True:
            if not self.proc.alive():
                raise RegistryError(
                    f"the registry exited with code {self.proc.returncode}; last log lines "
                    f"({self.log_path}):\n{self.proc.log_tail()}"
                )
            if self._ready():
                return self.proc
            if time.monotonic() > deadline:
                tail = self.proc.log_tail()
                self.stop(kill=True)
                raise RegistryError(
                    f"timed out waiting for the registry at {self.url}/v2/; last log lines "
                    f"({self.log_path}):\n{tail}"
                )
            time.sleep(0.05)

    def stop(self, *, kill: bool = False) -> None:
        """SIGTERM (or SIGKILL), and waits until the process is gone."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if kill:
            proc.kill()
            proc.wait(10.0)
        else:
            proc.stop(grace=10.0)

    def push(self, archive: Path, name: str) -> str:
        """Copies the image in the OCI archive ``archive`` into the registry as ``name``
        (``busybox:1.35``) and returns its reference there (``127.0.0.1:PORT/busybox:1.35``)."""
        if self.proc is None or not self.proc.alive():
            raise RegistryError(f"cannot push {archive.name}: the registry is not running")
        skopeo = shutil.which("skopeo")
        if skopeo is None:
            raise RegistryError(
                "pushing an image needs skopeo (Debian: hack/install-packages.sh installs it)"
            )
        reference = self.reference(name)
        # The registry speaks plain HTTP: --dest-tls-verify=false is what lets skopeo use it
        # (it tries https first). The archive holds one image, so it needs no name in it.
        argv = [
            skopeo,
            "copy",
            "--quiet",
            "--dest-tls-verify=false",
            f"oci-archive:{archive}",
            f"docker://{reference}",
        ]
        try:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=PUSH_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired as err:
            raise RegistryError(
                f"skopeo copy {archive} -> {reference} took over {PUSH_TIMEOUT:.0f} s"
            ) from err
        if done.returncode != 0:
            raise RegistryError(
                f"skopeo copy {archive} -> {reference} failed with exit code "
                f"{done.returncode}:\n{done.stderr.strip()}\nlast registry log lines "
                f"({self.log_path}):\n{self.proc.log_tail()}"
            )
        return reference

    def push_from_layout(
        self, layout: Path, repository: str, digest: str, *, tag: str | None = None
    ) -> str:
        """Uploads the image ``digest`` of the OCI layout ``layout`` (its manifest, config and
        layers, byte for byte, so the digest is the same) as ``repository`` over the registry
        API, tagged ``tag`` too if given; returns ``HOST:PORT/repository@digest``. What the
        registry has already is not sent again."""
        if self.proc is None or not self.proc.alive():
            raise RegistryError(f"cannot push {repository}: the registry is not running")

        def blob(d: str) -> Path:
            algorithm, hexa = d.split(":", 1)
            return layout / "blobs" / algorithm / hexa

        try:
            manifest_bytes = blob(digest).read_bytes()
            manifest = json.loads(manifest_bytes)
        except (OSError, ValueError) as err:
            raise RegistryError(f"{layout} has no readable manifest {digest}: {err}") from err
        base = f"{self.url}/v2/{repository}"
        try:
            for d in [manifest["config"]["digest"], *(x["digest"] for x in manifest["layers"])]:
                if self._http.head(f"{base}/blobs/{d}", timeout=30).status_code == 200:
                    continue
                started = self._http.post(f"{base}/blobs/uploads/", timeout=30)
                started.raise_for_status()
                location = urllib.parse.urljoin(self.url, started.headers["Location"])
                sep = "&" if "?" in location else "?"
                done = self._http.put(
                    f"{location}{sep}digest={d}",
                    data=blob(d).read_bytes(),
                    headers={"Content-Type": "application/octet-stream"},
                    timeout=PUSH_TIMEOUT,
                )
                done.raise_for_status()
            for reference in (digest, *([tag] if tag else [])):
                put = self._http.put(
                    f"{base}/manifests/{reference}",
                    data=manifest_bytes,
                    headers={"Content-Type": manifest["mediaType"]},
                    timeout=60,
                )
                put.raise_for_status()
        except (requests.RequestException, KeyError, OSError) as err:
            raise RegistryError(f"pushing {repository}@{digest} from {layout}: {err}") from err
        return f"{self.host}/{repository}@{digest}"

    def _ready(self) -> bool:
        try:
            resp = self._http.get(f"{self.url}/v2/", timeout=2.0)
        except requests.RequestException:
            return False
        return resp.status_code == 200
