"""What the plugin's ``replay`` reads from the cluster: the installed functions' logs and the
installed Triggers.

Replaying a decision needs the events a function received and the routing the Broker applied.
Both are in the cluster: every function logs in full each event that led to an action
(shared/platform/logs.py), and the Triggers in kn-rescheduler's namespace are the routing. Read
with the user's own kubeconfig, they replace a checkout's ``make archive`` and ``knative/``:
the replay then routes as this installation does, not as the repository's manifests say.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from kubectl_kn_rescheduler.routing import filters, triggers
from shared.platform import kube

# Every function's pods carry this label (a Knative Service's and a Deployment's alike), and
# their container is named "function" (knative/*.yaml).
FUNCTION_PODS: Final = "app.kubernetes.io/component=function"
CONTAINER: Final = "function"
BROKER: Final = "default"


@dataclass(frozen=True)
class Logs:
    """The function pods' log lines, and the pods whose log could not be read (starting, gone,
    or no right to read it), each with why."""

    lines: tuple[str, ...]
    pods: int
    unreadable: tuple[str, ...]


def function_logs(api: kube.Kube, namespace: str) -> Logs:
    lines: list[str] = []
    unreadable: list[str] = []
    pods = list(api.list_all("Pod", namespace, label_selector=FUNCTION_PODS))
    for pod in pods:
        name = pod["metadata"]["name"]
        path = kube.path_for("Pod", namespace, name, "log")
        try:
            lines += api.text(path, {"container": CONTAINER}).splitlines()
        except kube.KubeError as exc:
            said = str(exc).strip()
            unreadable.append(f"{name}: {said.splitlines()[0] if said else type(exc).__name__}")
    return Logs(tuple(lines), len(pods), tuple(unreadable))


def installed_triggers(api: kube.Kube, namespace: str) -> tuple[list[triggers.Trigger], list[str]]:
    """The Triggers of the namespace's Broker ``default``, as Knative reads them, and those it
    would refuse (each with why): a user's own Trigger there may be anything."""
    found: list[triggers.Trigger] = []
    refused: list[str] = []
    for doc in api.list_all("Trigger", namespace):
        try:
            trigger = triggers.trigger_from(doc, namespace, "Trigger")
        except (triggers.InvalidManifest, filters.InvalidFilter) as exc:
            refused.append(str(exc))
            continue
        if trigger.broker == BROKER:
            found.append(trigger)
    return found, refused
