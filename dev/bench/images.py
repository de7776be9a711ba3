"""The functions' images: their size, and the cold start of a function in its container beside
the same function as a bare process.

Both cold starts are measured the same way as ``bench.coldstart``: from the spawn (``podman
run``, or the gunicorn process) a real event is POSTed every 20 ms until one is answered with a
2xx. The container runs as its Knative Service would run it (``run_image``: the image's
non-root user, a read-only root filesystem, every capability dropped, no privilege escalation),
so the difference is what the container adds on one node: creating it from the local store,
its mount namespace and its read-only root, and python importing from the image's layers. An
image pull and Knative's own share (queue-proxy, activator) are not in either number.

The sizes are the OCI archive's (compressed layers, what a registry stores and a node pulls)
and the image's unpacked size in the local store. ``tests/e2e/test_images.py`` uses
``run_image`` to start every image and ask it a real request.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import statistics
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dev.bench.common import JSON
from dev.localcluster.procs import Proc
from dev.stack.functions import FUNCTIONS, ROOT, command, free_port
from shared.api.keys import APISERVER_UPDATE, POLICY_ANNOTATION

IMAGES_DIR = ROOT / ".local" / "images"
BUILD_SCRIPT = ROOT / "hack" / "build-image.sh"
TOOLS = ("mmdebstrap", "buildah", "skopeo", "podman", "runc")
# What podman needs on hosts like CI's, where the image runs without any daemon:
# - runc: crun refuses a host whose cgroups are in hybrid (v1 + v2) mode;
# - explicit ulimits: podman asks for a million open files, which a root without
#   CAP_SYS_RESOURCE (a sandboxed CI runner) may not set; Kubernetes nodes give containerd's
#   defaults, of the same order as these;
# - the host's network: no container network to set up (netavark, slirp), and the function
#   reaches a local API server on loopback as the test's kubeconfig says.
PODMAN_RUN = (
    "podman",
    "run",
    "--detach",
    "--runtime",
    "runc",
    "--ulimit",
    "nofile=4096:4096",
    "--ulimit",
    "nproc=4096:4096",
    "--network",
    "host",
)


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


def archive(function: str) -> Path:
    return IMAGES_DIR / f"{function}.tar"


def build(functions: Sequence[str], log: Callable[[str], None] = print) -> float:
    """Builds the images of ``functions`` (hack/build-image.sh); returns the seconds it took."""
    start = time.monotonic()
    subprocess.run(["bash", str(BUILD_SCRIPT), *functions], check=True, cwd=ROOT)
    took = time.monotonic() - start
    log(f"images: built {' '.join(functions)} in {took:.0f} s")
    return took


def load(function: str) -> str:
    """Loads the function's OCI archive into podman's store; returns the image's reference."""
    out = subprocess.run(
        ["podman", "load", "--quiet", "--input", str(archive(function))],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    # "Loaded image: localhost/kn-rescheduler/<fn>:<tag>" (or "Loaded image(s): ...").
    return out.strip().splitlines()[-1].split(": ", 1)[1].split(",")[0]


def security_flags(security_context: Mapping[str, Any]) -> list[str]:
    """podman's flags for a container's Kubernetes securityContext (the fields knative/ uses).

    runAsNonRoot is the kubelet refusing a root user: the caller checks the image's USER.
    A read-only root in Kubernetes gets no tmpfs anywhere but /dev/shm, so podman's own
    tmpfs on /tmp, /var/tmp and /run (--read-only-tmpfs) is turned off.
    """
    flags: list[str] = []
    if security_context.get("readOnlyRootFilesystem"):
        flags += ["--read-only", "--read-only-tmpfs=false"]
    for cap in (security_context.get("capabilities") or {}).get("drop") or []:
        flags += ["--cap-drop", cap]
    if security_context.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    if "runAsUser" in security_context:
        flags += ["--user", str(security_context["runAsUser"])]
    # seccompProfile RuntimeDefault: podman's default profile is the runtime default.
    return flags


def image_user(image: str) -> str:
    out = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Config.User}}", image],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.strip()


@dataclass
class Container:
    name: str
    image: str

    def logs(self) -> str:
        # podman logs writes what the container wrote to stderr on its own stderr.
        return subprocess.run(
            ["podman", "logs", self.name],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            check=False,
        ).stdout[-4000:]

    def running(self) -> bool:
        out = subprocess.run(
            ["podman", "inspect", "--format", "{{.State.Running}}", self.name],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        return out.strip() == "true"


@contextlib.contextmanager
def run_image(
    image: str,
    env: Mapping[str, str],
    *,
    security_context: Mapping[str, Any],
    mounts: Mapping[Path, str] | None = None,
) -> Iterator[Container]:
    """Starts ``image`` detached with ``env`` (PORT among it) and the securityContext's
    restrictions, ``mounts`` (host path -> container path) read-only; removes it afterwards."""
    name = f"knr-{uuid.uuid4().hex[:10]}"
    args = [*PODMAN_RUN, "--name", name, *security_flags(security_context)]
    for key, value in env.items():
        args += ["--env", f"{key}={value}"]
    for host, inside in (mounts or {}).items():
        args += ["--volume", f"{host}:{inside}:ro"]
    subprocess.run([*args, image], check=True, capture_output=True, text=True)
    container = Container(name, image)
    try:
        yield container
    finally:
        subprocess.run(
            ["podman", "rm", "--force", "--time", "5", name], capture_output=True, check=False
        )


def pod_event(oom_killed: bool) -> tuple[dict[str, str], bytes]:
    """An ApiServerSource pod event of an opted-in pod, OOM-killed or running."""
    state: JSON = (
        {"terminated": {"reason": "OOMKilled", "exitCode": 137}}
        if oom_killed
        else {"running": {"startedAt": "2026-01-01T00:00:00Z"}}
    )
    name = f"web-{uuid.uuid4().hex[:6]}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "shop",
            "uid": str(uuid.uuid4()),
            "annotations": {POLICY_ANNOTATION: "3"},
        },
        "spec": {"nodeName": "node-7", "containers": [{"name": "app", "image": "shop/web:1"}]},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": "app", "ready": not oom_killed, "restartCount": 1, "state": state}
            ],
        },
    }
    headers = {
        "ce-specversion": "1.0",
        "ce-id": str(uuid.uuid4()),
        "ce-source": "https://kube-apiserver.example",
        "ce-type": APISERVER_UPDATE,
        "ce-subject": f"/apis/v1/namespaces/shop/pods/{name}",
        "content-type": "application/json",
    }
    return headers, json.dumps(pod).encode()


def post(port: int, headers: Mapping[str, str], body: bytes) -> tuple[int, bytes]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/", data=body, headers=dict(headers), method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def first_answer(port: int, alive: Callable[[], bool], timeout: float = 60.0) -> float:
    """Seconds until an OOM-killed pod's event is answered 200, polling every 20 ms."""
    start = time.monotonic()
    headers, body = pod_event(oom_killed=True)
    while time.monotonic() - start < timeout:
        try:
            if post(port, headers, body)[0] == 200:
                return time.monotonic() - start
        except OSError:
            pass
        if not alive():
            raise RuntimeError("the function exited before it answered")
        time.sleep(0.02)
    raise TimeoutError(f"no answer in {timeout:.0f} s")


# The function measured: it answers a pod event from the event alone (no API server, no
# Prometheus), so both numbers are the function's start and nothing else.
COLD_FUNCTION = "detect-failures"
COLD_ENV = {
    "HOST": "127.0.0.1",
    "GUNICORN_CMD_ARGS": "--worker-tmp-dir /dev/shm --no-control-socket",
}
SECURITY_CONTEXT = {
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}


def container_cold_start(image: str) -> float:
    port = free_port()
    start = time.monotonic()
    with run_image(
        image, {**COLD_ENV, "PORT": str(port)}, security_context=SECURITY_CONTEXT
    ) as container:
        # Counted from the moment `podman run` was called (it returns once the container runs).
        first_answer(port, container.running)
        return time.monotonic() - start


def process_cold_start(workdir: Path) -> float:
    """The same function as the local stack spawns it (stack.functions.FunctionServer's command
    and environment), without FunctionServer's own readiness polling."""
    port = free_port()
    env = {**COLD_ENV, "PYTHONPATH": str(ROOT), "PORT": str(port)}
    start = time.monotonic()
    proc = Proc(COLD_FUNCTION, command(COLD_FUNCTION), workdir / "process.log", env=env, cwd=ROOT)
    try:
        first_answer(port, proc.alive)
        return time.monotonic() - start
    finally:
        proc.stop(grace=5.0)


def sizes(function: str, image: str) -> JSON:
    unpacked = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Size}}", image],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    history = json.loads(
        subprocess.run(
            ["podman", "history", "--format", "json", image],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    # Newest first. The function's own layers are those above the Dockerfile's `ARG FUNCTION`;
    # all the others (the Debian base, the dependencies, shared/) are the same in every image,
    # stored once by a registry and pulled once by a node.
    own = 0
    for entry in history:
        if "ARG FUNCTION" in entry.get("CreatedBy", ""):
            break
        own += int(entry.get("size") or 0)
    return {
        "archive_mb": round(archive(function).stat().st_size / 1e6, 1),
        "unpacked_mb": round(int(unpacked.strip()) / 1e6, 1),
        "base_mb": round(int(history[-1].get("size") or 0) / 1e6, 1),
        "own_layers_kb": round(own / 1e3, 1),
    }


def measure(workdir: Path, *, quick: bool = False, log: Callable[[str], None] = print) -> JSON:
    """Sizes of every built image, and the cold start of COLD_FUNCTION in its container and as
    a bare process (median of 5 runs each, 1 with ``quick``)."""
    missing = missing_tools()
    if missing:
        raise RuntimeError(f"images need {', '.join(missing)} (hack/install-packages.sh)")
    workdir.mkdir(parents=True, exist_ok=True)
    if not archive(COLD_FUNCTION).exists():
        build([COLD_FUNCTION], log)
    result: JSON = {"sizes": {}}
    for function in FUNCTIONS:
        if archive(function).exists():
            result["sizes"][function] = sizes(function, load(function))
    image = load(COLD_FUNCTION)
    runs = 1 if quick else 5
    container: list[float] = []
    process: list[float] = []
    # Interleaved, so that whatever else the machine does weighs on both alike.
    for _ in range(runs):
        container.append(container_cold_start(image))
        process.append(process_cold_start(workdir))
    result["cold_start"] = {
        "function": COLD_FUNCTION,
        "runs": runs,
        "container_s": [round(s, 3) for s in container],
        "process_s": [round(s, 3) for s in process],
        "container_median_s": round(statistics.median(container), 3),
        "process_median_s": round(statistics.median(process), 3),
    }
    log(f"images: cold start {result['cold_start']}")
    return result
