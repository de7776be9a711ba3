"""``--only admission``: the same pod creates with no admission of ours, the webhook, the policies.

Issue "No webhook on Kubernetes 1.36" asks what each admission mode costs a pod create, side
by side in one run. Three modes, on one local control plane, in rotating blocks (so that drift
of the machine over the run is shared by all three):

- ``none``: nothing of ours registered;
- ``webhook``: mutate-admission as its image runs it (gunicorn, TLS), registered as
  knative/webhook.yaml registers it;
- ``policies``: the MutatingAdmissionPolicies of knative/components/admission-policies.

Two kinds of pod, created alternately: an *opted-in* pod belongs to a real ReplicaSet with
``scheduling-retries: "3"``, a state that excludes two nodes and the flat list beside it, so
both modes do their whole work (label, stamps, the required node affinity, the preferences); a
*plain* pod belongs to a ReplicaSet without a policy, as most pods of a cluster do, and gets
nothing (what every other pod create pays for the mode), in the namespace of the opted-in
workloads and in one without any. The namespace also holds ``holders`` other
ReplicaSets (a Deployment's revision history): a policy with params is evaluated once per
object of the param kind in the pod's namespace that carries the param label (opted in and not
scaled to 0: a fifth of them here), so their number is part of its cost. Pods ask
for a scheduler nobody runs (so none is bound and the affinity path is the one a real pod
takes) and carry labels the ReplicaSet does not select (so it never counts them).

One client, back to back: the latency of each create as the client sees it, and the creates
per second of each block. Every admitted pod is checked for the mode's stamp (a create that
missed it would be measured for nothing).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from dev.bench.common import (
    JSON,
    ROOT,
    create_namespace,
    delete_namespace,
    ratio,
    summary,
    wait_until,
)
from dev.bench.selector import code_of
from dev.localcluster.cluster import Cluster
from dev.localcluster.rest import Rest
from dev.stack import admission_policies
from dev.stack import webhook as webhook_setup
from dev.stack.functions import FunctionServer, environment
from shared.api import avoidnodes
from shared.api.keys import EXCLUDED_NODES_ANNOTATION, POLICY_ANNOTATION, STATE_ANNOTATION
from shared.api.state import WorkloadState, dump_state

NAMESPACE: Final = "bench-admission"
# A namespace with no opted-in workload, as most of a cluster's are.
ELSEWHERE: Final = "bench-admission-elsewhere"
REGISTRATION: Final = webhook_setup.NAME + "-bench-admission"
MODES: Final = ("none", "webhook", "policies")
SECTION_START: Final = "<!-- admission-modes:start -->"
SECTION_END: Final = "<!-- admission-modes:end -->"


def _replicaset(
    rest: Rest,
    name: str,
    annotations: dict[str, str],
    replicas: int = 1,
    namespace: str = NAMESPACE,
) -> JSON:
    """A ReplicaSet whose pods no scheduler places (at 0 replicas it is no param)."""
    body = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "schedulerName": "bench-nobody",
                    "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                },
            },
        },
    }
    made: JSON = rest.post(f"/apis/apps/v1/namespaces/{namespace}/replicasets", body)
    return made


def _owner(rest: Rest, excluded: tuple[str, ...]) -> JSON:
    """The ReplicaSet the created pods belong to: opted in, two nodes excluded."""
    rs = _replicaset(rest, "hooked", {POLICY_ANNOTATION: "3"})
    uid = rs["metadata"]["uid"]
    state = WorkloadState(moves=len(excluded), excluded_nodes=excluded, holder_uid=uid)
    flat = avoidnodes.render(state, per_pod=False, holder_uid=uid)
    patched: JSON = rest.request(
        "PATCH",
        f"/apis/apps/v1/namespaces/{NAMESPACE}/replicasets/hooked",
        body={
            "metadata": {
                "annotations": {STATE_ANNOTATION: dump_state(state), avoidnodes.ANNOTATION: flat}
            }
        },
        content_type="application/merge-patch+json",
    )
    return patched


def _plain_owner(rest: Rest) -> JSON:
    """A ReplicaSet that did not opt in."""
    return _replicaset(rest, "plain", {}, replicas=0)


def _pod(rs: JSON) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "admitted-",
            "labels": {"bench": "admission"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": rs["metadata"]["name"],
                    "uid": rs["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {
            "schedulerName": "bench-nobody",
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        },
    }


def _stamped(pod: JSON) -> bool:
    return EXCLUDED_NODES_ANNOTATION in (pod["metadata"].get("annotations") or {})


def _dry_run(rest: Rest, rs: JSON) -> bool:
    created = rest.request(
        "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body=_pod(rs), params={"dryRun": "All"}
    )
    return _stamped(created)


class Modes:
    """Switches the cluster between the three modes, waiting until a dry run shows each.

    The policies are installed first (the workloads created after them get their param label
    at creation) and then only disabled and enabled again: deleting them would stop the API
    server's param informers for good (dev/stack/admission_policies.py)."""

    def __init__(self, cluster: Cluster, server: FunctionServer) -> None:
        self.cluster, self.server = cluster, server
        self.rs: JSON = {}
        self.api = cluster.api_client()
        assert server.ca_file is not None
        self.registration = webhook_setup.configuration(
            server.url, server.ca_file, name=REGISTRATION
        )
        self.policies = admission_policies.rendered(environment(cluster.kubeconfig))
        admission_policies.install(self.api, self.policies)
        admission_policies.wait_until_params(self.api)

    def clear(self) -> None:
        webhook_setup.unregister(self.api, REGISTRATION)
        admission_policies.disable(self.api)

    def enter(self, mode: str) -> None:
        self.clear()
        if mode == "webhook":
            webhook_setup.register(self.api, self.registration)
        elif mode == "policies":
            admission_policies.install(self.api, self.policies)
        wait_until(
            lambda: _dry_run(self.cluster.rest, self.rs) == (mode != "none"),
            30,
            0.1,
            f"admission mode {mode}",
        )


def creations(
    cluster: Cluster,
    modes: Modes,
    owners: dict[str, JSON],
    pods: int,
    blocks: int,
    log: Callable[[str], None],
) -> JSON:
    """``pods`` creates of each kind per mode, in ``blocks`` rotating blocks."""
    rest = cluster.rest
    keys = [(mode, kind) for mode in MODES for kind in owners]
    latencies: dict[tuple[str, str], list[float]] = {k: [] for k in keys}
    seconds: dict[tuple[str, str], float] = dict.fromkeys(keys, 0.0)
    stamped: dict[tuple[str, str], int] = dict.fromkeys(keys, 0)
    per_block = max(pods // blocks, 1)
    bodies = {kind: _pod(rs) for kind, rs in owners.items()}
    for block in range(blocks):
        # Rotate the order too, so no mode always follows the same one.
        order = MODES[block % 3 :] + MODES[: block % 3]
        for mode in order:
            modes.enter(mode)
            for _ in range(per_block):
                for kind, body in bodies.items():
                    t = time.perf_counter()
                    namespace = owners[kind]["metadata"]["namespace"]
                    created = rest.post(f"/api/v1/namespaces/{namespace}/pods", body)
                    elapsed = time.perf_counter() - t
                    latencies[(mode, kind)].append(elapsed)
                    seconds[(mode, kind)] += elapsed
                    stamped[(mode, kind)] += _stamped(created)
        log(f"  block {block + 1}/{blocks} done")
    modes.clear()
    out: JSON = {"pods_per_mode": per_block * blocks, "blocks": blocks}
    for mode in MODES:
        out[mode] = {}
        for kind in owners:
            key = (mode, kind)
            out[mode][kind] = {
                "latency_ms": summary(latencies[key], 1000.0),
                "creates_per_s": round(len(latencies[key]) / seconds[key], 1),
                "stamped": stamped[key],
            }
    for mode in ("webhook", "policies"):
        for kind in owners:
            here, base = out[mode][kind], out["none"][kind]
            here["p50_ratio"] = ratio(here["latency_ms"]["p50"], base["latency_ms"]["p50"])
            here["p99_ratio"] = ratio(here["latency_ms"]["p99"], base["latency_ms"]["p99"])
            here["throughput_ratio"] = ratio(base["creates_per_s"], here["creates_per_s"])
    return out


def measure(
    cluster: Cluster,
    workdir: Path,
    *,
    quick: bool,
    log: Callable[[str], None],
    pods: int = 1000,
    holders: int = 50,
) -> JSON:
    if quick:
        pods, holders = 60, 5
    rest = cluster.rest
    create_namespace(rest, NAMESPACE)
    create_namespace(rest, ELSEWHERE)
    server: FunctionServer | None = None
    modes: Modes | None = None
    try:
        ca, crt, key = webhook_setup.make_tls(workdir / "tls")
        server = FunctionServer(
            "mutate-admission",
            workdir,
            env=environment(cluster.kubeconfig),
            tls=(crt, key),
            ca_file=ca,
        ).start()
        modes = Modes(cluster, server)
        # The other ReplicaSets: a fifth running and opted in (params of the policies), the
        # rest scaled to 0 as a Deployment's revision history is, half of those opted in.
        for i in range(holders):
            running = i < holders // 5
            opted = running or i % 2 == 0
            _replicaset(
                rest,
                f"history-{i}",
                {POLICY_ANNOTATION: "3"} if opted else {},
                replicas=1 if running else 0,
            )
        rs = _owner(rest, tuple(cluster.nodes[:2]))
        modes.rs = rs
        owners = {
            "opted_in": rs,
            "plain": _plain_owner(rest),
            "elsewhere": _replicaset(rest, "plain", {}, replicas=0, namespace=ELSEWHERE),
        }
        log(f"admission: {pods} pod creates per mode, {holders} other ReplicaSets in the namespace")
        result = creations(cluster, modes, owners, pods, blocks=6 if not quick else 3, log=log)
        result["holders"] = holders
        for mode in ("webhook", "policies"):
            for kind in owners:
                r = result[mode][kind]
                log(
                    f"  {mode}, {kind}: p50 x{r['p50_ratio']}, p99 x{r['p99_ratio']}, "
                    f"time per pod x{r['throughput_ratio']}"
                )
        return result
    finally:
        if modes is not None:
            modes.clear()
        if server is not None:
            server.stop()
        delete_namespace(rest, NAMESPACE)
        delete_namespace(rest, ELSEWHERE)


# -- RESULTS.md ----------------------------------------------------------------------------------


def render(result: JSON, results_file: str, date: str, code: str) -> str:
    rows = []
    for mode, what in (
        ("none", "no admission of ours"),
        ("webhook", "the webhook (mutate-admission over TLS)"),
        ("policies", "the MutatingAdmissionPolicies"),
    ):
        for kind, pods in (
            ("opted_in", "opted in"),
            ("plain", "plain"),
            ("elsewhere", "plain, other namespace"),
        ):
            r = result[mode][kind]
            lat = r["latency_ms"]
            ratios = (
                "1.00 | 1.00 | 1.00"
                if mode == "none"
                else f"{r['p50_ratio']:.2f} | {r['p99_ratio']:.2f} | {r['throughput_ratio']:.2f}"
            )
            rows.append(
                f"| {what} | {pods} | {lat['p50']:.2f} ms | {lat['p99']:.2f} ms | "
                f"{r['creates_per_s']} | {ratios} | {r['stamped']} |"
            )
    return (
        f"{SECTION_START}\n"
        "## Admission: none, the webhook, the policies\n\n"
        f"Run {date}, {code} (raw: [`{results_file}`](results/{results_file})), "
        "`python -m dev.bench --only admission`. "
        f"{result['pods_per_mode']:,} pod creates of each kind per mode, in {result['blocks']} "
        "rotating blocks, one client back to back. Opted in: owned by a ReplicaSet with "
        '`scheduling-retries: "3"` excluding two nodes (label, stamps, required and preferred '
        "node affinity); plain: owned by a ReplicaSet without a policy (nothing to do); plain, "
        "other namespace: the same in a namespace with no opted-in workload. "
        f"{result['holders']} other ReplicaSets in the namespace: a fifth running and opted in "
        "(params of the policies), the rest at 0 replicas as revision history is, half of those "
        "opted in (no params: they make no pods). Ratios "
        "are to no admission, for the same kind of pod; time per pod is the inverse of "
        "creates/s.\n\n"
        "| admission | pods | p50 | p99 | creates/s | p50 ratio | p99 ratio | time per pod "
        "ratio | stamped |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(rows) + "\n"
        f"{SECTION_END}\n"
    )


def write_section(results: JSON, results_path: Path, target: Path) -> None:
    section = render(
        results["measurements"]["admission"], results_path.name, results["date"], code_of(results)
    )
    text = target.read_text()
    start, end = text.find(SECTION_START), text.find(SECTION_END)
    if start != -1 and end != -1:
        text = text[:start] + section + text[end + len(SECTION_END) + 1 :]
    else:
        anchor = text.find("## Reading these numbers")
        text = (
            text.rstrip("\n") + "\n\n" + section
            if anchor == -1
            else text[:anchor] + section + "\n" + text[anchor:]
        )
    target.write_text(text)


def main(argv: list[str] | None = None) -> int:
    """``python -m dev.bench.admission RESULTS_JSON``: rewrite the section from a saved run."""
    args = argv if argv is not None else sys.argv[1:]
    path = Path(args[0]).resolve()
    write_section(json.loads(path.read_text()), path, ROOT / "dev" / "bench" / "RESULTS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
