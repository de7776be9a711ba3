"""Scheduling throughput (pods/s) with and without score-nodes as an extender (``--only
throughput``): does calling the extender twice per pod slow kube-scheduler down?

One local cluster (20 nodes, no Prometheus). Every Node carries a fresh usage record
(``kn-rescheduler.io/usage``, written here as annotate-usage writes it), varied but under the
thresholds, so the extender filters no node out and every pod has the whole cluster to choose
from. score-nodes is served as it ships (stack.functions.FunctionServer). Each round creates a
batch of bare pods with small requests, as fast as the API server accepts them (a few client
threads), and times from the first create until every pod of the batch has a node
(``spec.nodeName``, read by polling the namespace); then the pods are deleted and the next round
starts. Four schedulers, one after the other in the same run:

- ``default``: the cluster's own kube-scheduler, no extender;
- ``extender``: a second kube-scheduler with the shipped configuration
  (``stack.up.load_aware_scheduler_config``: ``nodeCacheCapable: true``, node names only,
  which score-nodes looks up in its node cache) calling score-nodes; the pods name
  ``schedulerName: kn-rescheduler-load-aware``;
- ``extender-objects``: the same with ``nodeCacheCapable: false`` (whole Node objects in every
  call, as shipped before the node cache), for the comparison in the same run;
- ``second-no-extender``: that same configuration with its ``extenders`` removed, so that
  ``extender`` against it isolates the extender's cost from "a second scheduler process".

score-nodes' decisions during each system's rounds are read from its metrics, by reason: with
the node cache they must be ``fits`` and ``scored`` (decided on the cached usage), not
``no-usage`` (a cold cache passing everything, which would make a do-nothing extender look
fast).

kube-scheduler's API client is rate limited (``clientConnection.qps`` and ``burst``; 50 and 100
when unset, pkg/scheduler/apis/config/v1 defaults), and every pod costs it at least one call
(the binding) plus an event, on a second client with the same limits. A batch larger than the
burst is therefore bound at about ``qps`` pods/s whatever the scheduling itself costs. All three
schedulers get the same explicit ``clientConnection`` in a run; a run measures each of
``CLIENTS``: the defaults, and limits raised out of the way so that the scheduling cycle (where
the extender is called, one pod at a time) is what bounds throughput. The cluster's own scheduler
takes its setting from the cluster's start, so each setting has its own cluster.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import requests
from prometheus_client.parser import text_string_to_metric_families

from dev.bench.common import JSON, create_namespace, ratio
from dev.localcluster.cluster import Cluster
from dev.stack.functions import FunctionServer, environment, free_port
from dev.stack.up import load_aware_scheduler_config
from shared.api.keys import LOAD_AWARE_SCHEDULER_NAME, USAGE_ANNOTATION
from shared.api.usage import Estimate, Reading, UsageRecord

SYSTEMS: Final = ("default", "extender", "extender-objects", "second-no-extender")
# clientConnection per setting: kube-scheduler's defaults, written out, and limits no batch
# here reaches (the scheduling cycle bounds throughput then).
CLIENTS: Final[Mapping[str, Mapping[str, int]]] = {
    "defaults": {"qps": 50, "burst": 100},
    "raised": {"qps": 2000, "burst": 4000},
}
NAMESPACE: Final = "bench-throughput"
LABEL: Final = "bench.kn-rescheduler.io/throughput"
CREATE_THREADS: Final = 8
POLL_EVERY: Final = 0.05


@dataclass(frozen=True)
class Sizes:
    nodes: int
    pods: int
    rounds: int
    clients: tuple[str, ...]
    # Time allowed for one batch to be bound.
    bound_timeout: float


FULL_SIZES: Final = Sizes(nodes=20, pods=200, rounds=5, clients=tuple(CLIENTS), bound_timeout=120)
QUICK_SIZES: Final = Sizes(nodes=4, pods=20, rounds=1, clients=("defaults",), bound_timeout=60)


# -- pure helpers ----------------------------------------------------------------------------------


def usage_record(index: int, now: datetime) -> str:
    """Node ``index``'s usage: varied (CPU 10..60 %, memory 15..65 %), always under the
    thresholds (so the extender's filter passes it), the peaks included."""
    cpu = 10.0 + (index * 37) % 51
    memory = 15.0 + (index * 53) % 51
    record = UsageRecord(
        sampled_at=now.replace(microsecond=0),
        source="prometheus",
        cpu=Reading(now=cpu, avg5m=cpu, max1h=cpu + 5),
        memory=Reading(now=memory, avg5m=memory, max1h=memory + 5),
        estimate=Estimate(),
    )
    return record.to_json()


def pod(name: str, scheduler: str | None) -> JSON:
    """A bare pod with small requests (20 nodes hold thousands), on ``scheduler``."""
    spec: JSON = {
        "containers": [
            {
                "name": "app",
                "image": "registry.example.com/bench/app:1.0",
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
            }
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {LABEL: "true"}},
        "spec": spec,
    }


def second_scheduler_config(
    extender_url: str, client: Mapping[str, int], *, extender: bool, node_cache: bool = True
) -> dict[str, Any]:
    """The shipped second scheduler's configuration with ``client`` as its clientConnection
    limits; without its extenders when ``extender`` is false, with whole Node objects in each
    call when ``node_cache`` is false (nothing else changes)."""
    config = load_aware_scheduler_config(extender_url)
    if not extender:
        config.pop("extenders", None)
    elif not node_cache:
        for entry in config["extenders"]:
            entry["nodeCacheCapable"] = False
    config["clientConnection"] = dict(client)
    return config


def pods_per_second(pods: int, seconds: float) -> float:
    if seconds <= 0:
        raise ValueError(f"a batch cannot be bound in {seconds} s")
    return round(pods / seconds, 2)


def extender_calls(exposition: str) -> dict[str, int]:
    """score-nodes' answered calls so far, per verb, from its /metrics page: the proof that a
    scheduler called the extender (an ``ignorable`` extender that is never reached would
    otherwise look like a fast one)."""
    calls: dict[str, int] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == "knr_extender_requests_total" and sample.labels["code"] == "200":
                verb = sample.labels["verb"]
                calls[verb] = calls.get(verb, 0) + int(sample.value)
    return calls


def extender_decisions(exposition: str) -> dict[str, int]:
    """score-nodes' node decisions so far, per verb and reason ("filter/fits", ...)."""
    decisions: dict[str, int] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == "knr_extender_node_decisions_total":
                key = f"{sample.labels['verb']}/{sample.labels['reason']}"
                decisions[key] = decisions.get(key, 0) + int(sample.value)
    return decisions


def summarise(rounds: Mapping[str, Sequence[float]]) -> JSON:
    """Per system: the median pods/s over its rounds and every round's; the ratios that answer
    the question (the extender against the same second scheduler without it, and against the
    cluster's own)."""
    medians = {s: (statistics.median(r) if r else None) for s, r in rounds.items()}
    out: JSON = {
        s: {"pods_per_s": list(r), "median_pods_per_s": medians[s]} for s, r in rounds.items()
    }
    out["ratio_extender_to_second_no_extender"] = ratio(
        medians.get("extender"), medians.get("second-no-extender")
    )
    out["ratio_extender_to_default"] = ratio(medians.get("extender"), medians.get("default"))
    out["ratio_extender_objects_to_second_no_extender"] = ratio(
        medians.get("extender-objects"), medians.get("second-no-extender")
    )
    return out


# -- the measurement ------------------------------------------------------------------------------


class _Batch:
    """Creates and times batches of pods on one cluster."""

    def __init__(self, cluster: Cluster, sizes: Sizes, log: Callable[[str], None]) -> None:
        self.cluster = cluster
        self.sizes = sizes
        self.log = log
        self.count = 0

    def annotate_usage(self) -> None:
        """Fresh records on every node (usage_stale_after is minutes: once per round)."""
        now = datetime.now(UTC)
        for i, node in enumerate(self.cluster.nodes):
            self.cluster.rest.patch(
                f"/api/v1/nodes/{node}",
                {"metadata": {"annotations": {USAGE_ANNOTATION: usage_record(i, now)}}},
            )

    def run(self, scheduler: str | None) -> float:
        """One batch: pods/s from the first create until all are bound."""
        rest = self.cluster.rest
        self.annotate_usage()
        self.count += 1
        names = [f"p{self.count}-{i}" for i in range(self.sizes.pods)]
        path = f"/api/v1/namespaces/{NAMESPACE}/pods"
        started = time.monotonic()
        with ThreadPoolExecutor(CREATE_THREADS) as pool:
            list(pool.map(lambda n: rest.post(path, pod(n, scheduler)), names))
        created = time.monotonic() - started
        deadline = started + self.sizes.bound_timeout
        # Only the pods still without a node: the list shrinks to nothing, so polling costs the
        # API server (and this machine's cores, shared with the scheduler) less as it goes.
        unbound = {"labelSelector": LABEL, "fieldSelector": "spec.nodeName="}
        while left := len(rest.get(path, params=unbound)["items"]):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{left} of {len(names)} pods unbound in the time allowed")
            time.sleep(POLL_EVERY)
        elapsed = time.monotonic() - started
        self._delete()
        rate = pods_per_second(len(names), elapsed)
        self.log(
            f"throughput: {scheduler or 'default-scheduler'}: {len(names)} pods bound in "
            f"{elapsed:.2f} s (created in {created:.2f} s): {rate} pods/s"
        )
        return rate

    def _delete(self) -> None:
        rest = self.cluster.rest
        path = f"/api/v1/namespaces/{NAMESPACE}/pods"
        # Grace 0: the API server removes them at once, no kubelet round trip.
        rest.request("DELETE", path, params={"labelSelector": LABEL, "gracePeriodSeconds": "0"})
        deadline = time.monotonic() + 60
        while rest.get(path, params={"labelSelector": LABEL})["items"]:
            if time.monotonic() > deadline:
                raise TimeoutError("the batch's pods were not deleted")
            time.sleep(0.2)


def _one_setting(client_name: str, sizes: Sizes, workdir: Path, log: Callable[[str], None]) -> JSON:
    client = CLIENTS[client_name]
    cluster = Cluster(
        workdir / f"cluster-{client_name}",
        nodes=sizes.nodes,
        quiet=True,
        prometheus=False,
        keep_workdir=True,
        scheduler_config={"clientConnection": dict(client)},
    )
    server: FunctionServer | None = None
    try:
        cluster.start()
        # With its default ServiceAccount: pods created before it exists are refused.
        create_namespace(cluster.rest, NAMESPACE)
        port = free_port()
        server = FunctionServer(
            "score-nodes",
            workdir / f"logs-{client_name}",
            env=environment(cluster.kubeconfig, KN_RESCHEDULER_LOG_LEVEL="WARNING"),
            port=port,
        ).start()
        batch = _Batch(cluster, sizes, log)
        rounds: dict[str, list[float]] = {}
        calls: dict[str, dict[str, int]] = {}

        def read_metrics() -> str:
            assert server is not None
            with requests.Session() as session:
                session.trust_env = False  # no proxy between us and the loopback
                page = session.get(server.url + "metrics", timeout=5)
                page.raise_for_status()
                return page.text

        decisions: dict[str, dict[str, int]] = {}

        for system in SYSTEMS:
            proc = None
            scheduler: str | None = None
            if system != "default":
                scheduler = LOAD_AWARE_SCHEDULER_NAME
                proc = cluster.start_scheduler(
                    f"throughput-{system}",
                    second_scheduler_config(
                        f"http://127.0.0.1:{port}",
                        client,
                        extender=system.startswith("extender"),
                        node_cache=system != "extender-objects",
                    ),
                )
            try:
                # A first batch warms the scheduler's informers and the function up; not counted.
                batch.run(scheduler)
                before = read_metrics()
                rounds[system] = [batch.run(scheduler) for _ in range(sizes.rounds)]
                after = read_metrics()
                calls[system] = {
                    verb: extender_calls(after).get(verb, 0) - extender_calls(before).get(verb, 0)
                    for verb in ("filter", "prioritize")
                }
                was, now = extender_decisions(before), extender_decisions(after)
                decisions[system] = {
                    key: now[key] - was.get(key, 0) for key in now if now[key] > was.get(key, 0)
                }
            finally:
                if proc is not None:
                    proc.stop(grace=5.0)
                    # The cluster would otherwise revive it, or report it as a process that died.
                    with contextlib.suppress(ValueError):
                        cluster.procs.remove(proc)
        out = summarise(rounds)
        out["client_connection"] = dict(client)
        # score-nodes' answered calls during each scheduler's counted rounds.
        out["extender_calls"] = calls
        # ... and their node decisions by reason (from the cache, not a cold pass-through).
        out["extender_decisions"] = decisions
        return out
    finally:
        if server is not None:
            server.stop()
        cluster.stop()


def measure(workdir: Path, *, quick: bool, log: Callable[[str], None]) -> JSON:
    sizes = QUICK_SIZES if quick else FULL_SIZES
    workdir.mkdir(parents=True, exist_ok=True)
    out: JSON = {
        "nodes": sizes.nodes,
        "pods_per_round": sizes.pods,
        "rounds": sizes.rounds,
        "warmup_rounds": 1,
        "create_threads": CREATE_THREADS,
        "settings": {},
    }
    for client_name in sizes.clients:
        log(f"throughput: clientConnection {client_name} {dict(CLIENTS[client_name])}")
        out["settings"][client_name] = _one_setting(client_name, sizes, workdir, log)
    return out
