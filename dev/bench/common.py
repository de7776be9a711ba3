"""What every measurement shares: scales, statistics, identities, API request counts, CPU time.

API requests are attributed per client with the API server's own flow control (APF): each
system under test talks to the API server as its own user (a client certificate from the
cluster's CA, bound to cluster-admin), and a FlowSchema of ours routes that user's requests to
the ``exempt`` priority level (no queueing, no throttling). The API server's
``apiserver_flowcontrol_dispatched_requests_total{flow_schema=...}`` then counts exactly that
client's requests, watches included, while ``apiserver_request_total`` gives the total.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import os
import platform
import re
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml
from prometheus_client.parser import text_string_to_metric_families

from dev.localcluster import pki
from dev.localcluster.cluster import CLUSTER_NAME, K8S_VERSION, Cluster
from dev.localcluster.rest import ApiError, Rest

JSON = dict[str, Any]
ROOT: Final = Path(__file__).resolve().parents[2]
RESULTS_DIR: Final = ROOT / "dev" / "bench" / "results"
CORPUS_FILE: Final = ROOT / "dev" / "bench" / "corpus" / "pod-events.jsonl.gz"

# The users the systems under test run as (see the module docstring).
KN_USER: Final = "bench-kn-rescheduler"
DESCHEDULER_USER: Final = "bench-descheduler"
DRIVER_USER: Final = "bench-driver"


@dataclass(frozen=True)
class Scales:
    """Every size and bound of the suite; ``FULL`` is ``make bench``, ``QUICK`` CI's."""

    # 1-3: time to recovery, moves, API cost per move.
    nodes: int = 20
    faulty: int = 4
    deployments: int = 30
    replicas: int = 2
    # How long a system gets to recover every replica (the 5-minute target window).
    recovery_bound: float = 300.0
    # The descheduler's --descheduling-interval values: its shipped cadence and a tuned one.
    descheduler_intervals: tuple[str, ...] = ("2m", "10s")
    # 3: healthy pod updates driven with the pipeline running.
    healthy_updates: int = 1000
    healthy_pods: int = 20
    # 4: detect-failures throughput.
    corpus_events: int = 2000
    inprocess_rounds: int = 5
    http_requests: int = 6000
    http_concurrency: int = 8
    # 5: webhook.
    webhook_reviews: int = 1000
    tls_reviews: int = 1000
    creations: int = 300
    creation_rate: float = 10.0
    # 6: scale. The brief asks for 1,000 nodes and 10,000 pods; the local cluster has addresses
    # for 8,192 nodes (dev/localcluster/addresses.py), but a 5,000-pod rollout already takes
    # about six minutes here (see dev/bench/scale.py).
    scale_nodes: int = 240
    scale_pods: int = 4800
    scale_faulty_share: float = 0.02
    scale_budget: float = 900.0
    # 7: cold start.
    cold_start_runs: int = 3
    # 8 (only with --only source-selector): the ApiServerSource's label selector, 10 % of the
    # pods opted in; about 1,000 pod changes per round.
    selector_nodes: int = 4
    selector_deployments: int = 20
    selector_replicas: int = 10
    selector_opted_in: int = 2
    selector_rounds: int = 5


FULL: Final = Scales()
QUICK: Final = Scales(
    nodes=6,
    faulty=2,
    deployments=4,
    replicas=2,
    recovery_bound=45.0,
    descheduler_intervals=("10s",),
    healthy_updates=50,
    healthy_pods=4,
    corpus_events=300,
    inprocess_rounds=2,
    http_requests=300,
    http_concurrency=4,
    webhook_reviews=50,
    tls_reviews=50,
    creations=20,
    creation_rate=10.0,
    scale_nodes=30,
    scale_pods=150,
    scale_faulty_share=0.1,
    scale_budget=120.0,
    cold_start_runs=1,
    selector_deployments=10,
    selector_replicas=3,
    selector_opted_in=1,
    selector_rounds=2,
)


def scales_dict(scales: Scales) -> JSON:
    return dataclasses.asdict(scales)


# -- statistics ---------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summary(values: Sequence[float], unit_scale: float = 1.0) -> JSON:
    """n, p50, p95, p99, mean, max of ``values`` times ``unit_scale`` (None when empty)."""
    scaled = [v * unit_scale for v in values]

    def r(v: float | None) -> float | None:
        return None if v is None else round(v, 4)

    return {
        "n": len(scaled),
        "p50": r(percentile(scaled, 50)),
        "p95": r(percentile(scaled, 95)),
        "p99": r(percentile(scaled, 99)),
        "mean": r(statistics.fmean(scaled)) if scaled else None,
        "max": r(max(scaled)) if scaled else None,
    }


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 3)


# -- the machine ----------------------------------------------------------------------------------


def _command_output(argv: Sequence[str]) -> str:
    try:
        return subprocess.run(
            argv, check=False, capture_output=True, text=True, timeout=20
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def code_version() -> JSON:
    """The commit the harness and the functions ran from, and any local changes to them."""
    commit = _command_output(["git", "-C", str(ROOT), "rev-parse", "HEAD"])
    dirty = _command_output(
        [
            "git",
            "-C",
            str(ROOT),
            "status",
            "--porcelain",
            "--",
            "shared",
            "functions",
            "dev",
            "knative",
        ]
    )
    return {"commit": commit, "local_changes": dirty.splitlines()}


def machine() -> JSON:
    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kib = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    except OSError:
        pass
    go = _command_output(["go", "version"])
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "cpu_model": cpu_model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "go": go.removeprefix("go version ").split(" ")[0] if go else "",
        "kubernetes": K8S_VERSION,
        "load_average_at_start": list(os.getloadavg()),
    }


# -- identities and per-client request counts ---------------------------------------------------


def identity_kubeconfig(cluster: Cluster, user: str, directory: Path) -> Path:
    """A kubeconfig for ``user`` (client certificate from the cluster's CA), bound to
    cluster-admin, whose requests a FlowSchema named ``user`` counts (exempt level)."""
    ca = pki.KeyPair(
        cert_pem=(cluster.workdir / "pki" / "ca.crt").read_bytes(),
        key_pem=(cluster.workdir / "pki" / "ca.key").read_bytes(),
    )
    crt, key = pki.issue(ca, user, client=True).write(directory, user)

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": CLUSTER_NAME,
                "cluster": {
                    "server": cluster.server,
                    "certificate-authority-data": b64(ca_path(cluster)),
                },
            }
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate-data": b64(crt), "client-key-data": b64(key)},
            }
        ],
        "contexts": [{"name": CLUSTER_NAME, "context": {"cluster": CLUSTER_NAME, "user": user}}],
        "current-context": CLUSTER_NAME,
    }
    path = directory / f"{user}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    rest = cluster.rest
    _apply(
        rest,
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": user},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    )
    _apply(
        rest,
        "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas",
        {
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "kind": "FlowSchema",
            "metadata": {"name": user},
            "spec": {
                "matchingPrecedence": 50,
                "priorityLevelConfiguration": {"name": "exempt"},
                "rules": [
                    {
                        "subjects": [{"kind": "User", "user": {"name": user}}],
                        "resourceRules": [
                            {
                                "verbs": ["*"],
                                "apiGroups": ["*"],
                                "resources": ["*"],
                                "clusterScope": True,
                                "namespaces": ["*"],
                            }
                        ],
                        "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                    }
                ],
            },
        },
    )
    return path


def ca_path(cluster: Cluster) -> Path:
    return cluster.workdir / "pki" / "ca.crt"


def user_rest(cluster: Cluster, user: str, directory: Path) -> Rest:
    """A Rest client authenticated as ``user`` (see identity_kubeconfig)."""
    identity_kubeconfig(cluster, user, directory)
    return Rest(
        cluster.server,
        ca_file=ca_path(cluster),
        cert_file=directory / f"{user}.crt",
        key_file=directory / f"{user}.key",
        user_agent=user,
    )


def _apply(rest: Rest, collection: str, body: JSON) -> None:
    try:
        rest.post(collection, body)
    except ApiError as e:
        if e.status != 409:
            raise


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


# The webhook kn-rescheduler registers (knative/webhook.yaml); the API server's admission
# metrics carry it as their ``name`` label.
WEBHOOK_NAME: Final = "pods.kn-rescheduler.io"
_WEBHOOK_BUCKET: Final = "apiserver_admission_webhook_admission_duration_seconds_bucket{"
_WEBHOOK_FAIL_OPEN: Final = "apiserver_admission_webhook_fail_open_count{"
_EXECUTION_BUCKET: Final = "apiserver_flowcontrol_request_execution_seconds_bucket{"


def scrape(cluster: Cluster) -> dict[str, float]:
    """The API server's counters (see `parse_metrics`)."""
    status, text = cluster.rest.text("/metrics", 30.0)
    if status != 200:
        raise RuntimeError(f"/metrics answered {status}")
    return parse_metrics(text)


def parse_metrics(text: str) -> dict[str, float]:
    """From the API server's /metrics: requests (``total``, one ``fs:<flow schema>`` per
    schema), and the calls to kn-rescheduler's webhook as the API server timed them: its
    latency histogram's cumulative buckets (``webhook_le:<bound>``, every operation and
    outcome together, a call that failed open included with its time) and the calls it
    failed open (``webhook_fail_open``: the pod was created without the webhook); and, per flow
    schema, how long its requests other than watches executed, as cumulative buckets
    (``fs_le:<schema>:<bound>``): the bench gives each function an identity and a schema of its
    own (`identity_kubeconfig`), so these are each function's API latencies."""
    out: dict[str, float] = {"total": 0.0}
    for line in text.splitlines():
        if line.startswith(_EXECUTION_BUCKET):
            m = _SAMPLE.match(line)
            labels = (m.group(2) or "") if m else ""
            schema = re.search(r'flow_schema="([^"]*)"', labels)
            le = re.search(r'le="([^"]*)"', labels)
            # A watch's "execution" is its initial stage only: not a request's latency.
            if m and schema and le and 'type="regular"' in labels:
                key = f"fs_le:{schema.group(1)}:{le.group(1)}"
                out[key] = out.get(key, 0.0) + float(m.group(3))
            continue
        if line.startswith((_WEBHOOK_BUCKET, _WEBHOOK_FAIL_OPEN)):
            m = _SAMPLE.match(line)
            if not m or f'name="{WEBHOOK_NAME}"' not in (m.group(2) or ""):
                continue
            if line.startswith(_WEBHOOK_FAIL_OPEN):
                out["webhook_fail_open"] = out.get("webhook_fail_open", 0.0) + float(m.group(3))
                continue
            le = re.search(r'le="([^"]*)"', m.group(2) or "")
            if le:
                key = "webhook_le:" + le.group(1)
                out[key] = out.get(key, 0.0) + float(m.group(3))
            continue
        if line.startswith("apiserver_request_total{"):
            m = _SAMPLE.match(line)
            if m:
                out["total"] += float(m.group(3))
        elif line.startswith("apiserver_flowcontrol_dispatched_requests_total{"):
            m = _SAMPLE.match(line)
            schema = re.search(r'flow_schema="([^"]*)"', line)
            if m and schema:
                key = "fs:" + schema.group(1)
                out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    keys = set(before) | set(after)
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in sorted(keys)}


def _histogram(
    counters: Mapping[str, float], prefix: str
) -> tuple[int, float | None, float | None]:
    """How many observations the cumulative buckets ``<prefix><bound>`` of ``counters`` hold,
    and their 50th and 99th percentiles as a histogram can say them: the upper bound of the
    bucket the percentile falls in (None past the last bound, or with nothing observed)."""
    buckets = sorted(
        (float(key[len(prefix) :]), value)
        for key, value in counters.items()
        if key.startswith(prefix)
    )
    count = buckets[-1][1] if buckets else 0.0

    def at_most(q: float) -> float | None:
        for bound, seen in buckets:
            if seen >= q * count:
                return None if math.isinf(bound) else bound
        return None

    if not count:
        return 0, None, None
    return int(count), at_most(0.5), at_most(0.99)


def webhook_calls(counters: Mapping[str, float]) -> JSON:
    """The webhook's calls in ``counters`` (a `delta` of two scrapes): how many, how many failed
    open, and the 50th and 99th percentiles as bucket upper bounds (5 ms, 25 ms, 100 ms, 0.5 s,
    1 s, 2.5 s, 10 s, 25 s)."""
    calls, p50, p99 = _histogram(counters, "webhook_le:")
    return {
        "calls": calls,
        "failed_open": int(counters.get("webhook_fail_open", 0.0)),
        "p50_s_at_most": p50,
        "p99_s_at_most": p99,
    }


def api_requests(counters: Mapping[str, float], schema: str) -> JSON:
    """The requests of flow schema ``schema`` in ``counters`` (a `delta` of two scrapes), watches
    left out: how many, and how long the API server took to execute them, 50th and 99th
    percentiles as bucket upper bounds (0, 5 ms, 20 ms, 50 ms, 0.1 s, 0.2 s, 0.5 s, 1 s, 2 s, 5 s,
    10 s, 15 s, 30 s)."""
    requests, p50, p99 = _histogram(counters, f"fs_le:{schema}:")
    return {"requests": requests, "p50_s_at_most": p50, "p99_s_at_most": p99}


def parse_function_metrics(text: str) -> dict[str, float]:
    """From a function's own /metrics (shared/platform/metrics.py): the CloudEvents and
    admission reviews it answered (``events``, every type and answer) and its handler's time,
    as cumulative buckets (``handler_le:<bound>``) with their ``handler_sum``."""
    out: dict[str, float] = {"events": 0.0, "handler_sum": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "knr_events_received_total":
                out["events"] += sample.value
            elif sample.name == "knr_handler_seconds_bucket":
                key = "handler_le:" + sample.labels["le"]
                out[key] = out.get(key, 0.0) + sample.value
            elif sample.name == "knr_handler_seconds_sum":
                out["handler_sum"] += sample.value
    return out


def handling(counters: Mapping[str, float], seconds: float) -> JSON:
    """What a function handled in ``counters`` (a `delta` of two `parse_function_metrics`)
    over ``seconds``: the CloudEvents it answered (``events``, malformed ones included), the
    events or admission reviews its handler timed (``handled``) and how many a second, and the
    handler's time (mean; 50th and 99th percentiles as bucket upper bounds, 0.5 ms to 5 s). A
    timer-driven function handles one event a tick, so its mean is its time per tick."""
    handled, p50, p99 = _histogram(counters, "handler_le:")
    return {
        "events": int(counters.get("events", 0.0)),
        "handled": handled,
        "handled_per_s": round(handled / seconds, 2) if seconds > 0 else None,
        "handler_mean_s": round(counters.get("handler_sum", 0.0) / handled, 4) if handled else None,
        "handler_p50_s_at_most": p50,
        "handler_p99_s_at_most": p99,
    }


# -- CPU time of processes ----------------------------------------------------------------------

_TICK: Final = os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            text = Path(f"/proc/{pid}/task/{task}/children").read_text()
            out.extend(int(c) for c in text.split())
    except OSError:
        pass
    return out


def _tree(pid: int) -> Iterator[int]:
    """``pid`` and its live descendants, each once."""
    stack = [pid]
    seen: set[int] = set()
    while stack:
        p = stack.pop()
        if p not in seen:
            seen.add(p)
            yield p
            stack.extend(_children(p))


def own_cpu_seconds(pid: int) -> float:
    """utime+stime of ``pid`` alone (all its threads), none of its children: the harness
    process starts the control plane and every function, which ``cpu_seconds`` would count."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # fields[0] is the state (field 3); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / _TICK


def cpu_seconds(pid: int) -> float:
    """utime+stime of ``pid`` and its live descendants (gunicorn master and workers)."""
    return sum(own_cpu_seconds(p) for p in _tree(pid))


def cpu_of(pids: Mapping[str, int]) -> dict[str, float]:
    return {name: round(cpu_seconds(pid), 3) for name, pid in pids.items()}


def _peak_rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])  # kB
    except (OSError, ValueError, IndexError):
        pass
    return 0


def peak_rss_mib(pid: int, *, descendants: bool = True) -> float:
    """The peak resident set (VmHWM) of ``pid`` plus, unless told not to, that of its live
    descendants (gunicorn's master and workers), in MiB."""
    pids = _tree(pid) if descendants else iter([pid])
    return round(sum(_peak_rss_kib(p) for p in pids) / 1024, 1)


# -- small helpers --------------------------------------------------------------------------------


def wait_until(
    check: Callable[[], Any], timeout: float, every: float = 0.5, what: str = "condition"
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def create_namespace(rest: Rest, name: str) -> None:
    rest.post(
        "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )

    def sa() -> bool:
        try:
            rest.get(f"/api/v1/namespaces/{name}/serviceaccounts/default")
            return True
        except ApiError:
            return False

    wait_until(sa, 60, 0.2, f"namespace {name}'s default ServiceAccount")


def delete_namespace(rest: Rest, name: str, timeout: float = 180.0) -> None:
    try:
        rest.delete(f"/api/v1/namespaces/{name}")
    except ApiError as e:
        if e.status == 404:
            return
        raise

    def gone() -> bool:
        try:
            rest.get(f"/api/v1/namespaces/{name}")
            return False
        except ApiError as e:
            return e.status == 404

    wait_until(gone, timeout, 0.5, f"namespace {name} deleted")


def list_all(rest: Rest, path: str, params: Mapping[str, str] | None = None) -> list[JSON]:
    query = {"limit": "500", **(params or {})}
    items: list[JSON] = []
    while True:
        page = rest.get(path, query)
        items.extend(page.get("items", []))
        cont = page.get("metadata", {}).get("continue")
        if not cont:
            return items
        query = {**query, "continue": cont}


def is_ready(pod: JSON) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in pod.get("status", {}).get("conditions") or []
    )


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def finite_numbers(data: Any) -> Iterable[float]:
    """Every number in a nested result (for the harness's own checks)."""
    if isinstance(data, bool):
        return
    if isinstance(data, (int, float)):
        yield float(data)
    elif isinstance(data, Mapping):
        for v in data.values():
            yield from finite_numbers(v)
    elif isinstance(data, (list, tuple)):
        for v in data:
            yield from finite_numbers(v)


# -- Knative's Broker, for the benches that run more than one -----------------------------------


def broker_manifests(namespace: str, directory: Path, source: Path = ROOT / "knative") -> Path:
    """The project's Broker and Triggers (``source``) moved to ``namespace``, in ``directory``.

    Knative's dispatcher and filter watch every namespace's channels and Triggers: two Brokers
    on one control plane must live in two namespaces, or the second would take over the
    first's channel. Only Brokers and Triggers are copied; their delivery specs and filters
    are the shipped ones."""
    directory.mkdir(parents=True, exist_ok=True)
    docs: list[JSON] = []
    for path in sorted(source.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") in ("Broker", "Trigger"):
                doc["metadata"]["namespace"] = namespace
                docs.append(doc)
    (directory / "broker.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return directory


def archived(path: Path) -> list[JSON]:
    """The events a KnativeBroker's archive Trigger received (structured CloudEvents)."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.strip()]


def attributes(event: Mapping[str, Any]) -> dict[str, str]:
    """A structured CloudEvent's context attributes and extensions, as a Trigger filter sees
    them (everything but the data)."""
    return {k: str(v) for k, v in event.items() if k not in ("data", "data_base64")}
