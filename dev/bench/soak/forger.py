"""A client inside the cluster that forges the pipeline's CloudEvents.

Any pod of a cluster can POST a CloudEvent to a function's cluster-local Service, or to the
Broker's ingress: nothing in Knative checks who sent it. The forger does that, in bursts, with
the shapes the pipeline itself sends and the sources it uses (``/kn-rescheduler/<function>``):

- ``io.kn-rescheduler.pod.failing`` reports (``shared.pods.failing.FailingPod.to_data``) naming
  real healthy pods, with their real name, uid, owners and node, as failing with
  ``StuckPending``, ``FailedCreatePodSandBox``, ``CrashLoopBackOff`` and ``Evicted``;
- the same reports about pods and workloads nobody made (a made-up Deployment's ReplicaSet in
  a real namespace, another in a namespace that does not exist), on healthy nodes, repeated at
  every burst;
- ``io.kn-rescheduler.pod.rescheduled`` replies (``shared.pods.update_annotations.decide.
  reply_for``) saying pods were moved off healthy nodes for a node-fixable failure, about the
  real healthy pods and the made-up ones.

Each event goes to every destination it is given: every function's URL as the soak serves it
(dev/stack/stack.py: detect-failures, update-annotations, assess-nodes, sweep-failures,
label-nodes, annotate-usage, score-nodes, the webhook over TLS, and the soak's own
rebalance-nodes) and the Broker. What each answered is counted; what it changed is for the
invariants (``forged-claims-change-nothing``, bench.soak.invariants) to judge, from what the
forger says it claimed (:meth:`Forger.claims`).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final

import requests
import urllib3

from dev.bench.soak.invariants import Forged
from dev.localcluster.rest import Rest
from shared.api.keys import (
    EVENT_POD_FAILING,
    EVENT_POD_RESCHEDULED,
    EVENT_SOURCE_PREFIX,
    POLICY_STAMP_ANNOTATION,
)

JSON = dict[str, Any]

# The reasons the forger claims about real healthy pods.
REASONS: Final = ("StuckPending", "FailedCreatePodSandBox", "CrashLoopBackOff", "Evicted")
# Made-up workloads: (namespace or None for a real one, Deployment, pod-template hash).
MADE_UP: Final = ((None, "ghost", "5d8f7c9b4"), ("payments", "billing", "6c7d8f9b5"))


def _failure(reason: str, pod: str, namespace: str, uid: str, node: str) -> JSON:
    """What a report of ``reason`` says, shaped as detect-failures and the sweep write it."""
    if reason == "StuckPending":
        return {
            "message": f"pending on {node} for 45m0s",
            "container": None,
            "restartCount": 0,
            "ranForSeconds": 0,
            "why": f"pod has been bound to node {node} and its sandbox never came up for 45m0s "
            "(threshold 10m0s): ContainerCreating",
        }
    if reason == "FailedCreatePodSandBox":
        message = (
            "Failed to create pod sandbox: rpc error: code = Unknown desc = failed to setup "
            f'network for sandbox "{uuid.uuid4().hex * 2}": plugin type="calico" failed (add): '
            "stat /var/lib/calico/nodename: no such file or directory"
        )
        return {
            "message": message,
            "container": None,
            "restartCount": 0,
            "ranForSeconds": 0,
            "why": f"the kubelet of node {node} failed to create the pod's sandbox 9 times in "
            f"4m30s (threshold 30s): {message}",
        }
    if reason == "CrashLoopBackOff":
        return {
            "message": "back-off 5m0s restarting failed container=app "
            f"pod={pod}_{namespace}({uid})",
            "container": "app",
            "restartCount": 12,
            "ranForSeconds": 2,
            "why": "CrashLoopBackOff after 12 restarts (threshold 3)",
        }
    return {
        "message": "The node was low on resource: memory. Threshold quantity: 100Mi, "
        "available: 12Mi. ",
        "container": None,
        "restartCount": 0,
        "ranForSeconds": 3600,
        "why": "the kubelet failed the pod: Evicted",
    }


def _owner(kind: str, name: str, uid: str) -> JSON:
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


@dataclass
class Forger:
    """Posts forged events to ``destinations`` (name -> URL) in bursts (:meth:`burst`), about
    the Ready pods of ``targets`` ((namespace, label selector) pairs), naming ``nodes``."""

    rest: Rest
    destinations: Mapping[str, str]
    targets: Sequence[tuple[str, str]]
    nodes: Sequence[str]
    made_up_namespace: str
    timeout: float = 10.0
    answers: Counter[str] = field(default_factory=Counter)
    posted: int = 0
    _pods: dict[str, str] = field(default_factory=dict)
    _ids: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        # It posts to the webhook without checking its certificate (the stack's own), on
        # purpose: said once here, not at every post.
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        # The made-up pods: the same at every burst (a forger repeating itself).
        self._made_up: list[JSON] = []
        for i, (namespace, deployment, pod_hash) in enumerate(MADE_UP):
            ns = namespace or self.made_up_namespace
            rs = f"{deployment}-{pod_hash}"
            for j, node in enumerate(self.nodes):
                self._made_up.append(
                    {
                        "namespace": ns,
                        "name": f"{rs}-{uuid.uuid4().hex[:5]}",
                        "uid": str(uuid.uuid4()),
                        "node": node,
                        "ownerReferences": [_owner("ReplicaSet", rs, f"made-up-{i}-{rs}")],
                        "deployment": deployment,
                        "replicaSet": rs,
                        "reason": REASONS[(i + j) % len(REASONS)],
                    }
                )

    # -- what it claims ---------------------------------------------------------------------------

    def claims(self) -> Forged:
        with self._lock:
            return Forged(
                pods=dict(self._pods),
                nodes=frozenset(self.nodes),
                made_up_uids=frozenset(p["uid"] for p in self._made_up),
                made_up_workloads=frozenset(
                    f"{p['namespace']}/{name}"
                    for p in self._made_up
                    for name in (p["deployment"], p["replicaSet"])
                ),
                ids=frozenset(self._ids),
            )

    def _healthy_targets(self) -> list[JSON]:
        found = []
        for namespace, selector in self.targets:
            page = self.rest.get(
                f"/api/v1/namespaces/{namespace}/pods", {"labelSelector": selector}
            )
            for pod in page.get("items", []):
                conditions = (pod.get("status") or {}).get("conditions") or []
                ready = any(
                    c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
                )
                if ready and not pod["metadata"].get("deletionTimestamp"):
                    found.append(pod)
        return found

    def events(self) -> list[tuple[str, str, JSON]]:
        """One burst's events: (type, source, data)."""
        out: list[tuple[str, str, JSON]] = []
        reports = EVENT_SOURCE_PREFIX + "detect-failures"
        replies = EVENT_SOURCE_PREFIX + "update-annotations"
        for pod in self._healthy_targets():
            meta = pod["metadata"]
            node = str(pod["spec"].get("nodeName") or "")
            with self._lock:
                self._pods[meta["uid"]] = f"{meta['namespace']}/{meta['name']}"
            owners = meta.get("ownerReferences") or []
            for reason in REASONS:
                data = {
                    "namespace": meta["namespace"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "node": node,
                    "ownerReferences": owners,
                    "kind": "node-fixable",
                    "reason": reason,
                    "initContainer": False,
                    "startTime": (pod.get("status") or {}).get("startTime"),
                    "excludedNodes": [],
                    "policy": (meta.get("annotations") or {}).get(POLICY_STAMP_ANNOTATION),
                    **_failure(reason, meta["name"], meta["namespace"], meta["uid"], node),
                }
                out.append((EVENT_POD_FAILING, reports, data))
            owner = next((o for o in owners if o.get("controller")), None)
            if owner is not None:
                top = owner["name"].rsplit("-", 1)[0]
                out.append(
                    (EVENT_POD_RESCHEDULED, replies, self._reply(meta, node, owner["name"], top))
                )
        for made in self._made_up:
            data = {
                "namespace": made["namespace"],
                "name": made["name"],
                "uid": made["uid"],
                "node": made["node"],
                "ownerReferences": made["ownerReferences"],
                "kind": "node-fixable",
                "reason": made["reason"],
                "initContainer": False,
                "startTime": None,
                "excludedNodes": [],
                "policy": "4",
                **_failure(
                    made["reason"], made["name"], made["namespace"], made["uid"], made["node"]
                ),
            }
            out.append((EVENT_POD_FAILING, reports, data))
            out.append(
                (
                    EVENT_POD_RESCHEDULED,
                    replies,
                    self._reply(made, made["node"], made["replicaSet"], made["deployment"]),
                )
            )
        return out

    @staticmethod
    def _reply(meta: Mapping[str, Any], node: str, replica_set: str, deployment: str) -> JSON:
        """A pod.rescheduled reply as update-annotations sends it after a move."""
        return {
            "namespace": meta["namespace"],
            "name": meta["name"],
            "uid": meta["uid"],
            "node": node,
            "reason": "CrashLoopBackOff",
            "kind": "node-fixable",
            "action": "move",
            "workload": {"kind": "ReplicaSet", "name": replica_set},
            "topWorkload": {"kind": "Deployment", "name": deployment},
            "moves": 1,
            "budget": 4,
            "excludedNodes": [node],
            "exclusionsCleared": False,
            "message": f"moved pod {meta['name']} off node {node} after CrashLoopBackOff "
            f"(move 1 of 4); recorded earlier, removed now; excluded nodes now: {node}",
        }

    # -- posting ----------------------------------------------------------------------------------

    def _post(self, destination: str, url: str, kind: str, source: str, data: JSON) -> None:
        event_id = str(uuid.uuid4())
        headers = {
            "ce-specversion": "1.0",
            "ce-id": event_id,
            "ce-source": source,
            "ce-type": kind,
            "ce-subject": f"namespaces/{data['namespace']}/pods/{data['name']}",
            "content-type": "application/json",
        }
        with self._lock:
            self._ids.add(event_id)
        try:
            # The webhook's certificate is the stack's own: a forger does not check it.
            answer = requests.post(
                url, data=json.dumps(data), headers=headers, timeout=self.timeout, verify=False
            )
            status = str(answer.status_code)
        except requests.RequestException as exc:
            status = type(exc).__name__
        with self._lock:
            self.answers[f"{destination} {status}"] += 1
            self.posted += 1

    def burst(self, workers: int = 4) -> int:
        """Every event of one burst to every destination; the number of posts."""
        batch = self.events()
        jobs = [
            (name, url, kind, source, data)
            for kind, source, data in batch
            for name, url in self.destinations.items()
        ]
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for _ in pool.map(lambda job: self._post(*job), jobs):
                pass
        return len(jobs)


def run_bursts(
    forger: Forger,
    at: Sequence[float],
    started: float,
    stop: threading.Event,
    clock: Callable[[], float],
    log: Callable[[str], None],
) -> None:
    """Bursts at ``at`` seconds after ``started`` (on ``clock``), until ``stop``."""
    for when in sorted(at):
        if stop.wait(max(0.0, started + when - clock())):
            return
        try:
            sent = forger.burst()
        except Exception as exc:  # the run goes on; the figures say how many were posted
            log(f"  {clock() - started:5.1f}s forger burst failed: {type(exc).__name__}: {exc}")
            continue
        log(f"  {clock() - started:5.1f}s forged events posted ({sent} posts)")
