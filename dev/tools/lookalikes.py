"""Two checks of doing no harm, on a running local stack (``make up NODES=8``).

``python -m dev.tools.lookalikes --dir .local`` runs both and exits 1 if either finds harm:

- ``several-bad-nodes``: three nodes crash-loop every pod, and six Deployments of two replicas
  (``scheduling-retries: "4"``) prefer the three in six different orders. Failing on nodes where
  other workloads fail too is evidence against the nodes, never that the application is broken
  everywhere: every replica must end Ready on a healthy node, and no workload may be stopped
  (no ``MovesStopped`` Event).
- ``forged``: CloudEvents posted straight to update-annotations and assess-nodes (their URLs in
  ``DIR/stack.json``), as any pod of a cluster can: a stuck-pod and a sandbox report about a
  Deployment's pod seconds old; failure reports of made-up pods of made-up workloads on a
  healthy node, repeated; "evicted" reports of a StatefulSet's pod under uids nobody had, on
  nodes the sender chose. Nothing may be deleted, charged, excluded or marked.

Each check makes its own namespace and heals what it broke at the end (``--keep`` leaves them).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import requests
from cloudevents.conversion import to_binary
from cloudevents.http import CloudEvent

from dev.localcluster.keys import SIM_FAULT_LABEL
from shared.api.keys import (
    EVENT_POD_FAILING,
    FAILING_WORKLOADS_LABEL,
    MOVED_OFF_LABEL,
    NODE_HEALTH_ANNOTATION,
    POLICY_ANNOTATION,
    STATE_ANNOTATION,
    SUSPECT_LABEL,
)
from shared.platform import kube

JSON = dict[str, Any]
IMAGE: Final = "registry.example.com/shop/web:1.4.2"
# The marks a failure report or a move may set on a node (the load labels follow Prometheus).
MARKS: Final = (SUSPECT_LABEL, MOVED_OFF_LABEL, FAILING_WORKLOADS_LABEL)
BAD_COUNT: Final = 3


@dataclass
class Outcome:
    name: str
    problems: list[str] = field(default_factory=list)
    said: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def wait(check: Callable[[], Any], timeout: float, every: float = 2.0) -> Any:
    """``check``'s first truthy answer within ``timeout`` seconds, else its last one."""
    deadline = time.monotonic() + timeout
    while True:
        answer = check()
        if answer or time.monotonic() > deadline:
            return answer
        time.sleep(every)


def namespace(api: kube.Kube, name: str) -> str:
    api.create(
        "Namespace", None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    return name


def preferring(order: Sequence[str]) -> JSON:
    """Preferred node affinity for ``order``, the first most."""
    weights = (100, 50, 10)
    return {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": weight,
                    "preference": {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
                        ]
                    },
                }
                for weight, node in zip(weights, order, strict=False)
            ]
        }
    }


def deployment(name: str, replicas: int, retries: str, affinity: JSON | None = None) -> JSON:
    spec: JSON = {
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "app", "image": IMAGE}],
    }
    if affinity is not None:
        spec["affinity"] = affinity
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "annotations": {POLICY_ANNOTATION: retries}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    }


def ready_on(pod: JSON) -> str | None:
    """The node of a Ready pod, else None."""
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition.get("type") == "Ready" and condition.get("status") == "True":
            return str(pod.get("spec", {}).get("nodeName") or "")
    return None


def node_marks(api: kube.Kube) -> dict[str, JSON]:
    """What a report or a move may mark on every node: the suspect, moved-off and
    failing-workloads labels with their values, the suspect taint, and the workloads the
    node's health record names."""
    marks = {}
    for node in api.list_all("Node"):
        meta = node["metadata"]
        labels = meta.get("labels") or {}
        raw = (meta.get("annotations") or {}).get(NODE_HEALTH_ANNOTATION)
        record = json.loads(raw) if raw else {}
        marks[meta["name"]] = {
            "labels": {k: labels[k] for k in MARKS if k in labels},
            "taints": sorted(
                t["key"]
                for t in node.get("spec", {}).get("taints") or []
                if t["key"] == SUSPECT_LABEL
            ),
            "workloads": sorted({f.get("workload", "") for f in record.get("failures") or []}),
        }
    return marks


# -- several bad nodes --------------------------------------------------------------------------


def several_bad_nodes(api: kube.Kube, nodes: Sequence[str], timeout: float) -> Outcome:
    out = Outcome("several-bad-nodes")
    bad = list(nodes[1 : 1 + BAD_COUNT])
    ns = namespace(api, f"lookalikes-bad-{uuid.uuid4().hex[:5]}")
    for node in bad:
        api.merge_patch(
            "Node", None, node, {"metadata": {"labels": {SIM_FAULT_LABEL: "crashloop"}}}
        )
    out.said.append(f"nodes {', '.join(bad)} crash-loop every pod; namespace {ns}")
    names = []
    try:
        for i, order in enumerate(itertools.permutations(bad)):
            name = f"web-{i}"
            api.create("Deployment", ns, deployment(name, 2, "4", preferring(order)))
            names.append(name)

        def healthy() -> list[str]:
            pods = [
                p for p in api.list_all("Pod", ns) if not p["metadata"].get("deletionTimestamp")
            ]
            return [p["metadata"]["name"] for p in pods if ready_on(p) not in (None, *bad)]

        done = wait(lambda: len(healthy()) >= 2 * len(names), timeout)
        pods = list(api.list_all("Pod", ns))
        ready = healthy()
        out.said.append(
            f"{len(ready)} of {2 * len(names)} replicas Ready on healthy nodes after "
            f"{'<' if done else ''}{timeout:.0f} s"
        )
        if len(ready) < 2 * len(names):
            for p in pods:
                restarts = sum(
                    c.get("restartCount", 0)
                    for c in p.get("status", {}).get("containerStatuses") or []
                )
                out.said.append(
                    f"  {p['metadata']['name']} on {p['spec'].get('nodeName')}: "
                    f"{p.get('status', {}).get('phase')}, {restarts} restarts"
                )
            out.problems.append(f"only {len(ready)} of {2 * len(names)} replicas recovered")
        stopped = [
            e
            for e in api.list_all("Event", ns)
            if e.get("reason") in ("MovesStopped", "RetriesExhausted")
        ]
        for event in stopped:
            out.problems.append(
                f"{event['reason']} on {event['involvedObject']['name']}: {event['message']}"
            )
        moves = [e for e in api.list_all("Event", ns) if e.get("reason") == "Rescheduled"]
        out.said.append(f"{len(moves)} moves, {len(stopped)} stops or exhausted budgets")
    finally:
        for node in bad:
            api.merge_patch("Node", None, node, {"metadata": {"labels": {SIM_FAULT_LABEL: None}}})
    return out


# -- forged events ------------------------------------------------------------------------------


def post(url: str, event_type: str, data: JSON) -> int:
    attributes = {
        "id": str(uuid.uuid4()),
        "type": event_type,
        "source": "/a-pod-of-the-cluster",
        "subject": f"namespaces/{data.get('namespace')}/pods/{data.get('name')}",
        "datacontenttype": "application/json",
    }
    headers, body = to_binary(CloudEvent(attributes, data))
    return requests.post(url, data=body, headers=headers, timeout=10).status_code


def report(pod: JSON, reason: str, node: str, **extra: Any) -> JSON:
    """A pod.failing report about ``pod``, as anyone who can read its name and uid writes it."""
    meta = pod["metadata"]
    return {
        "namespace": meta["namespace"],
        "name": meta["name"],
        "uid": meta["uid"],
        "node": node,
        "ownerReferences": meta.get("ownerReferences") or [],
        "kind": "node-fixable",
        "reason": reason,
        "message": f"{reason} (forged)",
        **extra,
    }


def made_up(namespace_: str, workload: str, node: str) -> JSON:
    rs = f"{workload}-{uuid.uuid4().hex[:9]}"
    return {
        "namespace": namespace_,
        "name": f"{rs}-{uuid.uuid4().hex[:5]}",
        "uid": str(uuid.uuid4()),
        "node": node,
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": rs,
                "uid": str(uuid.uuid4()),
                "controller": True,
            }
        ],
        "kind": "node-fixable",
        "reason": "CrashLoopBackOff",
        "message": "back-off 40s restarting failed container (forged)",
    }


def forged(api: kube.Kube, functions: dict[str, str], nodes: Sequence[str]) -> Outcome:
    out = Outcome("forged")
    ns = namespace(api, f"lookalikes-forged-{uuid.uuid4().hex[:5]}")
    update, assess = functions["update-annotations"], functions["assess-nodes"]
    before = node_marks(api)
    healthy = nodes[0]
    api.create("Deployment", ns, deployment("young", 1, "3"))
    api.create(
        "StatefulSet",
        ns,
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "db", "annotations": {POLICY_ANNOTATION: "3"}},
            "spec": {
                "replicas": 1,
                "serviceName": "db",
                "selector": {"matchLabels": {"app": "db"}},
                "template": {
                    "metadata": {"labels": {"app": "db"}},
                    "spec": {
                        "terminationGracePeriodSeconds": 0,
                        "containers": [{"name": "app", "image": IMAGE}],
                    },
                },
            },
        },
    )

    def pod_of(app: str) -> JSON | None:
        found = list(api.list_all("Pod", ns, label_selector=f"app={app}"))
        return found[0] if len(found) == 1 else None

    young = wait(lambda: pod_of("young"), 30, every=0.2)
    db = wait(lambda: pod_of("db"), 60)
    if not young or not db:
        out.problems.append("the pods to forge about were not created")
        return out
    # Point 2: a pod seconds old, reported stuck and failing its sandbox on its own node.
    node = young["spec"].get("nodeName") or healthy
    codes = [
        post(update, EVENT_POD_FAILING, report(young, r, node))
        for r in ("StuckPending", "FailedCreatePodSandBox")
    ]
    # Point 3: made-up pods of two made-up workloads on a healthy node, three times over.
    for _ in range(3):
        for workload in ("ghost-a", "ghost-b"):
            codes.append(post(assess, EVENT_POD_FAILING, made_up(ns, workload, healthy)))
    # Point 4: the StatefulSet's pod "evicted and replaced" on nodes the sender chose.
    sts_uid = api.get("StatefulSet", ns, "db")["metadata"]["uid"]
    owner = [
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "name": "db",
            "uid": sts_uid,
            "controller": True,
        }
    ]
    for chosen in nodes[1:4]:
        codes.append(
            post(
                update,
                EVENT_POD_FAILING,
                report(db, "Evicted", chosen, uid=str(uuid.uuid4()), ownerReferences=owner),
            )
        )
    out.said.append(f"{len(codes)} forged events posted, answers {sorted(set(codes))}")
    time.sleep(5)  # let anything they might have set off happen
    for app, pod in (("young", young), ("db", db)):
        now = pod_of(app)
        if now is None or now["metadata"]["uid"] != pod["metadata"]["uid"]:
            out.problems.append(f"pod {pod['metadata']['name']} was removed")
    for kind, name in (("StatefulSet", "db"), ("Deployment", "young")):
        if STATE_ANNOTATION in (api.get(kind, ns, name)["metadata"].get("annotations") or {}):
            out.problems.append(f"{kind} {name} was charged (state written)")
    for rs in api.list_all("ReplicaSet", ns):
        if STATE_ANNOTATION in (rs["metadata"].get("annotations") or {}):
            out.problems.append(f"ReplicaSet {rs['metadata']['name']} was charged (state written)")
    after = node_marks(api)
    for name, marks in after.items():
        if marks != before.get(name):
            out.problems.append(f"node {name} was marked: {before.get(name)} -> {marks}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path(".local"), help="make up's directory")
    parser.add_argument("--only", choices=("several-bad-nodes", "forged"), action="append")
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds for the replicas to recover"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("KUBECONFIG", str(args.dir / "kubeconfig"))
    info = json.loads((args.dir / "stack.json").read_text())
    api = kube.Kube.from_environment()
    nodes = sorted(n["metadata"]["name"] for n in api.list_all("Node"))
    if len(nodes) < 2 * BAD_COUNT:
        parser.error(
            f"needs at least {2 * BAD_COUNT} nodes (make up NODES=8); the cluster has {len(nodes)}"
        )
    # The forged events first: the bad nodes' own marks would change under them.
    only = args.only or ["forged", "several-bad-nodes"]
    outcomes: Iterator[Outcome] = (
        several_bad_nodes(api, nodes, args.timeout)
        if name == "several-bad-nodes"
        else forged(api, info["functions"], nodes)
        for name in only
    )
    failed = False
    for outcome in outcomes:
        print(f"{outcome.name}: {'ok' if outcome.ok else 'HARM'}")
        for line in outcome.said:
            print(f"  {line}")
        for line in outcome.problems:
            print(f"  harm: {line}")
        failed = failed or not outcome.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
