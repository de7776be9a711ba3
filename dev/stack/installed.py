"""kn-rescheduler installed from knative/ on a real-node cluster, by the commands of
docs/install-without-serving.md.

The stack (stack.py) runs the functions as processes beside a cluster and carries events itself.
This is the other way, the one a platform team takes: the functions' images pushed to the
cluster's registry and pinned by digest (``make deploy-all``), the ``without-serving``
component (Knative Serving's ingress cannot run here), the webhook's certificate
(``make webhook-cert``); Knative Eventing, installed before from its own manifests
(``Cluster.install_knative_eventing``), then carries every event. Used by ``make demo
INSTALL=1`` and tests/e2e/test_knative_installed.py, so the two install the same way the docs
say.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from dev.localcluster import knative
from dev.localcluster.cluster import Cluster
from dev.localcluster.rest import ApiError
from dev.stack.functions import ROOT

NAMESPACE: Final = "kn-rescheduler"
COMPONENT: Final = "without-serving"
# The Knative objects of knative/ that must be Ready before an event can flow: the Broker the
# Triggers hang on, and the source of pod events.
KNATIVE_OBJECTS: Final = (
    ("eventing.knative.dev/v1", "brokers", "default"),
    ("sources.knative.dev/v1", "apiserversources", "pod-events"),
)
MAKE_TIMEOUT: Final = 1200.0


class InstallError(RuntimeError):
    """kn-rescheduler could not be installed (the message says which step, and its output)."""


def kubectl_command(c: Cluster) -> str:
    """KUBECTL for the deploy targets: the cluster's kubectl and kubeconfig."""
    return f"{c.bins_dir / 'kubectl'} --kubeconfig={c.kubeconfig}"


def deploy_variables(c: Cluster, work: str, components: str = COMPONENT) -> dict[str, str]:
    """What the deploy targets take here: the cluster's plain-HTTP registry and its kubectl.

    ``work`` is the deploy targets' KNR_WORK, two levels under the repository (their overlays
    refer to ``../../../knative``); ``components``, the COMPONENTS they add. The dead-letter
    sink runs the event-display of the Eventing installed here (DEAD_LETTERS_IMAGE), by digest:
    the released one knative/ pins is not in the cluster's registry.
    """
    if c.registry is None:
        raise InstallError("the cluster has no registry: start it with real nodes")
    variables = {
        "REGISTRY": f"{c.registry.host}/kn-rescheduler",
        "COMPONENTS": components,
        "SKOPEO_FLAGS": "--dest-tls-verify=false",
        "KUBECTL": kubectl_command(c),
        "KNR_WORK": work,
    }
    if c.event_display is not None:
        variables["DEAD_LETTERS_IMAGE"] = c.event_display
    return variables


def make(target: str, variables: Mapping[str, str], env: Mapping[str, str] | None = None) -> str:
    """``make TARGET VAR=value...`` in the repository; its output, or InstallError with it."""
    command = ["make", "--no-print-directory", target, *(f"{k}={v}" for k, v in variables.items())]
    try:
        done = subprocess.run(
            command,
            cwd=ROOT,
            env=None if env is None else dict(env),
            capture_output=True,
            text=True,
            timeout=MAKE_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise InstallError(f"make {target}: still running after {MAKE_TIMEOUT:.0f} s") from e
    if done.returncode != 0:
        raise InstallError(
            f"make {target} failed (exit {done.returncode}):\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return done.stdout


def missing(c: Cluster) -> list[str]:
    """What of the install is not yet running: Deployments without an available replica, and
    Knative objects not Ready (each named)."""
    waiting: list[str] = []
    try:
        deployments = c.rest.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments")["items"]
        waiting += [f"deployment/{n}" for n in knative.unavailable(deployments)]
        for api, plural, name in KNATIVE_OBJECTS:
            obj = c.rest.get(f"/apis/{api}/namespaces/{NAMESPACE}/{plural}/{name}")
            if not _ready(obj):
                waiting.append(f"{plural}/{name}")
    except ApiError as e:
        return [f"(the API server: {e})"]
    return waiting


def _ready(obj: Mapping[str, Any]) -> bool:
    conditions = obj.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def install(
    c: Cluster,
    work: str,
    say: Callable[[str], None] = lambda _: None,
    timeout: float = 480.0,
    components: str = COMPONENT,
) -> None:
    """docs/install-without-serving.md's steps on ``c`` (Knative Eventing already installed):
    build and push the images, apply knative/ with the components, make the webhook's
    certificate; then wait until every function runs and the Broker and the source are Ready.
    Run again with other components, it applies the change the same way."""
    variables = deploy_variables(c, work, components)
    say(f"make deploy-all COMPONENTS={components!r} (the images built, pushed, pinned by digest)")
    make("deploy-all", variables)
    say("make webhook-cert (a self-signed certificate for the webhook)")
    make(
        "webhook-cert",
        {
            "KNR_CERT_DIR": f"{work}/webhook-cert",
            "KUBECTL": variables["KUBECTL"],
            "KNR_WORK": work,
        },
    )
    deadline = time.monotonic() + timeout
    while waiting := missing(c):
        if time.monotonic() > deadline:
            raise InstallError(
                f"not running {timeout:.0f} s after the install: {', '.join(waiting)} "
                f"(kubectl -n {NAMESPACE} describe them)"
            )
        time.sleep(2.0)


def save_archive(c: Cluster, path: Path) -> str:
    """``make archive`` of the installed functions' logs into ``path``; what it said."""
    return make("archive", {"FILE": str(path), "KUBECTL": kubectl_command(c)})
