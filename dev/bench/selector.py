"""Measurement 8 (``--only source-selector``): what the ApiServerSource's label selector saves.

The webhook labels every pod it stamps with a policy (``kn-rescheduler.io/opted-in``) and the
ApiServerSource of ``knative/sources.yaml`` selects on that label, so the API server sends the
pipeline nothing about pods that never opted in. This measures the saving, both ways side by
side in one run on one local control plane, seeing the very same pod changes:

- *no selector*: Knative's adapter watching every pod (the source before the label), into its
  own Knative Broker (:class:`pipeline.broker.KnativeBroker`, the project's Triggers moved to a
  namespace of its own) and its own detect-failures process;
- *selector*: the adapter configured from ``knative/sources.yaml`` as it ships
  (:meth:`pipeline.source.ApiServerSource.from_manifest`), into another Broker and another
  detect-failures.

The webhook is registered with the API server as in a cluster. Each round creates
``selector_deployments`` Deployments of ``selector_replicas`` pods, ``selector_opted_in`` of
them with ``scheduling-retries: "3"`` (10 % of the pods at the default sizes), waits until every
pod is Ready, deletes the Deployments and waits until every pod is gone. *Pod changes* are the
watch events of those pods (added, modified, deleted), counted by an independent watch of the
namespace. Per round and per pipeline: events the adapter sent, events delivered to
detect-failures (add and update; the Triggers keep deletes out), both counted in the Broker's
archive (its catch-all Trigger sees every event the ingress accepted; an event counts as
delivered to detect-failures when that function's Trigger filter passes it), and the CPU
seconds of the adapter process and of the detect-failures process (gunicorn master and
worker, from /proc), from just before the round until both pipelines are idle again; all per
1,000 pod changes.
The medians over the rounds are reported, with the ratio no selector / selector.

The adapters' CPU includes their idle cost over the round (Go runtime, client-go), which the
selector does not remove; the webhook's CPU is not counted (the same for both, a label more).
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import yaml

from dev.bench.common import (
    JSON,
    ROOT,
    Scales,
    archived,
    attributes,
    broker_manifests,
    cpu_seconds,
    create_namespace,
    is_ready,
    list_all,
    ratio,
)
from dev.localcluster.cluster import Cluster
from dev.localcluster.rest import ApiError, Rest
from dev.pipeline.broker import KnativeBroker
from dev.pipeline.source import ApiServerSource, from_manifest
from dev.stack import webhook as webhook_setup
from dev.stack.functions import FunctionServer, environment
from kubectl_kn_rescheduler.routing import filters
from shared.api.keys import OPTED_IN_LABEL, POLICY_ANNOTATION

NAMESPACE = "bench-selector"
# The ApiServerSource's event types (add, update, delete): what the adapter sent.
APISERVER_TYPES: Final = "dev.knative.apiserver.resource."
IMAGE = "registry.example.com/shop/web:1.4.2"
MODES = ("no_selector", "selector")
# Section markers in dev/bench/RESULTS.md: a full run's rewrite carries the section over.
SECTION_START = "<!-- source-selector: dev/bench/selector.py -->"
SECTION_END = "<!-- /source-selector -->"


class PodChanges:
    """Counts the pod watch events of one namespace (ADDED, MODIFIED, DELETED), resuming the
    watch from the last resourceVersion seen so none is missed or counted twice."""

    def __init__(self, rest: Rest, namespace: str) -> None:
        self.rest = rest
        self.path = f"/api/v1/namespaces/{namespace}/pods"
        self.count = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="pod-changes", daemon=True)

    def start(self) -> PodChanges:
        self._rv = str(self.rest.get(self.path)["metadata"]["resourceVersion"])
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def value(self) -> int:
        with self._lock:
            return self.count

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for event in self.rest.watch(self.path, {"resourceVersion": self._rv}, 5):
                    obj = event.get("object") or {}
                    rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if rv:
                        self._rv = str(rv)
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        with self._lock:
                            self.count += 1
                    if self._stop.is_set():
                        return
            except ApiError:
                time.sleep(0.2)


@dataclass
class Pipeline:
    """One adapter -> Broker -> detect-failures chain."""

    name: str
    detect: FunctionServer
    broker: KnativeBroker
    source: ApiServerSource

    def usage(self) -> dict[str, float]:
        detect_pid = self.detect.proc.pid if self.detect.proc else 0
        sent, delivered = source_events(self.broker.archive, DETECT_FILTER)
        return {
            "sent": float(sent),
            "delivered": float(delivered),
            "adapter_cpu_s": cpu_seconds(self.source.pid or 0),
            "detect_cpu_s": cpu_seconds(detect_pid),
        }


def _detect_filter() -> filters.Filter:
    """detect-failures' Trigger filter, as shipped."""
    for path in sorted((ROOT / "knative").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            meta = (doc or {}).get("metadata") or {}
            if doc and doc.get("kind") == "Trigger" and meta.get("name") == "detect-failures":
                return filters.for_trigger(doc["spec"])
    raise LookupError("no detect-failures Trigger in knative/")


DETECT_FILTER: Final = _detect_filter()


def source_events(archive: Path, delivers: filters.Filter) -> tuple[int, int]:
    """Of the events in a Broker's archive, those the ApiServerSource sent, and those of them
    a Trigger with the filter ``delivers`` passes on to its subscriber."""
    sent = [e for e in archived(archive) if str(e.get("type", "")).startswith(APISERVER_TYPES)]
    return len(sent), sum(delivers(attributes(e)).delivers for e in sent)


def _deployment(name: str, replicas: int, opted_in: bool) -> JSON:
    labels = {"app": name}
    metadata: JSON = {"name": name}
    if opted_in:
        metadata["annotations"] = {POLICY_ANNOTATION: "3"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [{"name": "app", "image": IMAGE}],
                    "terminationGracePeriodSeconds": 0,
                },
            },
        },
    }


def _wait(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


@contextmanager
def _pipelines(cluster: Cluster, workdir: Path) -> Iterator[dict[str, Pipeline]]:
    env = environment(cluster.kubeconfig)
    shipped = from_manifest()
    with ExitStack() as stack:
        ca, crt, key = webhook_setup.make_tls(workdir / "tls")
        hook = FunctionServer(
            "mutate-admission", workdir / "logs", env=env, tls=(crt, key), ca_file=ca
        ).start()
        stack.callback(hook.stop)
        webhook_setup.register(cluster.api_client(), webhook_setup.configuration(hook.url, ca))
        webhook_setup.wait_until_called(cluster.api_client())
        stack.callback(webhook_setup.unregister, cluster.api_client())
        out: dict[str, Pipeline] = {}
        for mode in MODES:
            logs = workdir / "logs" / mode
            logs.mkdir(parents=True, exist_ok=True)
            detect = FunctionServer("detect-failures", logs, env=env).start()
            stack.callback(detect.stop)
            namespace = "kn-rescheduler-" + mode.replace("_", "-")
            broker = KnativeBroker(
                cluster.kubeconfig,
                cluster.api_client(),
                broker_manifests(namespace, workdir / mode / "knative"),
                {"detect-failures": detect.url},
                workdir / mode,
                logs,
            ).start()
            stack.callback(broker.stop)
            # The adapter beside its Broker, in the Broker's network namespace.
            url = broker.source_url
            if mode == "selector":
                source = ApiServerSource.from_manifest(
                    cluster.kubeconfig, url, log_path=logs / "adapter.log", wrap=broker.wrap
                )
            else:
                # The shipped source without its selector: what every pod used to cost.
                source = ApiServerSource(
                    cluster.kubeconfig,
                    url,
                    namespaces=shipped.namespaces,
                    resources=shipped.resources,
                    mode=shipped.mode,
                    name=shipped.name + "-no-selector",
                    namespace=shipped.namespace,
                    log_path=logs / "adapter.log",
                    wrap=broker.wrap,
                )
            source.start()
            stack.callback(source.stop)
            out[mode] = Pipeline(mode, detect, broker, source)
        yield out


def _round(
    rest: Rest, scales: Scales, pipelines: Mapping[str, Pipeline], changes: PodChanges
) -> JSON:
    d, r = scales.selector_deployments, scales.selector_replicas
    expected = d * r
    before = {name: p.usage() for name, p in pipelines.items()}
    changes0 = changes.value()
    t0 = time.monotonic()
    for i in range(d):
        body = _deployment(f"w{i:02d}", r, i < scales.selector_opted_in)
        rest.post(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments", body)
    pods_path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    _wait(
        f"{expected} pods Ready",
        lambda: sum(is_ready(p) for p in list_all(rest, pods_path)) >= expected,
        300,
    )
    live = list_all(rest, pods_path)
    labelled = sum(OPTED_IN_LABEL in (p["metadata"].get("labels") or {}) for p in live)
    for i in range(d):
        rest.delete(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/w{i:02d}")
    _wait("every pod gone", lambda: not list_all(rest, pods_path), 300)
    # Every change reached the unfiltered adapter's Broker, and both pipelines are idle.
    no_selector = pipelines["no_selector"]
    _wait(
        "the unselected adapter to send every pod change",
        lambda: (
            no_selector.usage()["sent"] - before["no_selector"]["sent"]
            >= changes.value() - changes0
        ),
        60,
    )
    for p in pipelines.values():
        p.broker.wait_idle(60)
    time.sleep(1.0)  # the last deliveries' CPU, and nothing else
    pod_changes = changes.value() - changes0
    after = {name: p.usage() for name, p in pipelines.items()}
    result: JSON = {
        "pods": len(live),
        "opted_in_pods": labelled,
        "pod_changes": pod_changes,
        "seconds": round(time.monotonic() - t0, 1),
    }
    for name in pipelines:
        used = {k: after[name][k] - before[name][k] for k in after[name]}
        result[name] = {
            "sent": int(used["sent"]),
            "delivered_to_detect_failures": int(used["delivered"]),
            "adapter_cpu_s": round(used["adapter_cpu_s"], 2),
            "detect_failures_cpu_s": round(used["detect_cpu_s"], 2),
            "per_1000_pod_changes": {
                k: round(1000 * v / max(pod_changes, 1), 3)
                for k, v in (
                    ("delivered_to_detect_failures", used["delivered"]),
                    ("adapter_cpu_s", used["adapter_cpu_s"]),
                    ("detect_failures_cpu_s", used["detect_cpu_s"]),
                )
            },
        }
    return result


def measure(scales: Scales, workdir: Path, *, log: Callable[[str], None]) -> JSON:
    log(f"source-selector: starting a {scales.selector_nodes}-node cluster")
    rounds: list[JSON] = []
    with (
        Cluster(
            workdir / "cluster",
            nodes=scales.selector_nodes,
            quiet=True,
            keep_workdir=True,
            prometheus=False,  # nothing here reads node metrics
        ) as cluster,
        _pipelines(cluster, workdir) as pipelines,
    ):
        rest = cluster.rest
        create_namespace(rest, NAMESPACE)
        changes = PodChanges(rest, NAMESPACE).start()
        try:
            for n in range(scales.selector_rounds):
                rounds.append(_round(rest, scales, pipelines, changes))
                r = rounds[-1]
                log(
                    f"  round {n + 1}/{scales.selector_rounds}: {r['pod_changes']} pod changes, "
                    f"delivered {r['no_selector']['delivered_to_detect_failures']} without the "
                    f"selector, {r['selector']['delivered_to_detect_failures']} with it"
                )
        finally:
            changes.stop()
    return {
        "nodes": scales.selector_nodes,
        "deployments": scales.selector_deployments,
        "replicas": scales.selector_replicas,
        "opted_in_deployments": scales.selector_opted_in,
        "label_selector": from_manifest().label_selector,
        "rounds": rounds,
        "medians_per_1000_pod_changes": medians(rounds),
    }


def medians(rounds: list[JSON]) -> JSON:
    """Per pipeline, the median per 1,000 pod changes of each figure; and the ratios."""
    out: JSON = {}
    for mode in MODES:
        out[mode] = {
            key: round(statistics.median(r[mode]["per_1000_pod_changes"][key] for r in rounds), 3)
            for key in rounds[0][mode]["per_1000_pod_changes"]
        }
    out["ratio_no_selector_to_selector"] = {
        key: _rounded(ratio(out["no_selector"][key], out["selector"][key]))
        for key in out["selector"]
    }
    out["opted_in_share"] = round(
        statistics.median(r["opted_in_pods"] / max(r["pods"], 1) for r in rounds), 3
    )
    return out


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def render(result: JSON, results_name: str, date: str, code: str) -> str:
    """The RESULTS.md section, between its markers; ``code`` says which code ran."""
    m = result["medians_per_1000_pod_changes"]
    ns, s, q = m["no_selector"], m["selector"], m["ratio_no_selector_to_selector"]
    rounds = result["rounds"]
    changes = [r["pod_changes"] for r in rounds]
    per_round = (
        f"{changes[0]:,} each"
        if min(changes) == max(changes)
        else f"{min(changes):,} to {max(changes):,}"
    )

    def total(mode: str, key: str) -> float:
        return float(sum(r[mode][key] for r in rounds))

    def x(value: float | None) -> str:
        return "—" if value is None else f"{value:,.1f}x"

    lines = [
        SECTION_START,
        "## 8. Pod events selected by label (`python -m dev.bench --only source-selector`)",
        "",
        f"A separate run, {date}, {code} (raw: "
        f"[`{results_name}`](results/{results_name})). {result['nodes']} kwok nodes, the webhook "
        f"registered; {len(rounds)} rounds, each {result['deployments']} Deployments x "
        f"{result['replicas']} pods created, Ready, deleted; {result['opted_in_deployments']} "
        f"of them opted in ({m['opted_in_share'] * 100:.0f} % of the pods carried the label). "
        "Two pipelines saw the same pod changes at once: Knative's adapter without a selector "
        f"and as shipped (`{result['label_selector']}`), each with its own detect-failures. "
        f"Pod changes per round: {per_round} (watch events: added, modified, deleted; deletes "
        "are never delivered to detect-failures, its Trigger keeps them out).",
        "",
        "| per 1,000 pod changes (median of the rounds) | no selector | selector | ratio |",
        "| --- | --- | --- | --- |",
        f"| events delivered to detect-failures | {ns['delivered_to_detect_failures']:,.0f} | "
        f"{s['delivered_to_detect_failures']:,.0f} | {x(q['delivered_to_detect_failures'])} |",
        f"| adapter CPU-s | {ns['adapter_cpu_s']:.2f} | {s['adapter_cpu_s']:.2f} | "
        f"{x(q['adapter_cpu_s'])} |",
        f"| detect-failures CPU-s | {ns['detect_failures_cpu_s']:.2f} | "
        f"{s['detect_failures_cpu_s']:.2f} | {x(q['detect_failures_cpu_s'])} |",
        "",
        f"Totals over the run: {sum(changes):,} pod changes; delivered "
        f"{total('no_selector', 'delivered_to_detect_failures'):,.0f} vs "
        f"{total('selector', 'delivered_to_detect_failures'):,.0f}; adapter "
        f"{total('no_selector', 'adapter_cpu_s'):.1f} vs {total('selector', 'adapter_cpu_s'):.1f}"
        f" CPU-s; detect-failures {total('no_selector', 'detect_failures_cpu_s'):.1f} vs "
        f"{total('selector', 'detect_failures_cpu_s'):.1f} CPU-s. How it is measured: "
        "`dev/bench/selector.py`; `python -m dev.bench.selector RESULTS_JSON` writes this section "
        "again from a saved run.",
        SECTION_END,
    ]
    return "\n".join(lines) + "\n"


def code_of(results: JSON) -> str:
    """Which code ran, for the section: the commit and any local changes."""
    code = results.get("code") or {}
    text = f"commit `{str(code.get('commit') or 'unknown')[:12]}`"
    changed = code.get("local_changes") or []
    if changed:
        text += f" with local changes to {', '.join(c.split()[-1] for c in changed)}"
    return text


def write_section(results: JSON, results_path: Path, target: Path) -> None:
    """Put the source-selector section of ``results`` into ``target`` (dev/bench/RESULTS.md)."""
    section = render(
        results["measurements"]["source-selector"],
        results_path.name,
        results["date"],
        code_of(results),
    )
    target.write_text(place(section, target.read_text()))


def main(argv: list[str] | None = None) -> int:
    """``python -m dev.bench.selector RESULTS_JSON``: rewrite the section from a saved run."""
    args = argv if argv is not None else sys.argv[1:]
    path = Path(args[0]).resolve()
    write_section(json.loads(path.read_text()), path, ROOT / "dev" / "bench" / "RESULTS.md")
    return 0


def place(section: str, results_md: str) -> str:
    """``results_md`` with its source-selector section replaced by ``section`` (or inserted
    before "## Reading these numbers", else at the end)."""
    start, end = results_md.find(SECTION_START), results_md.find(SECTION_END)
    if start != -1 and end != -1:
        return results_md[:start] + section + results_md[end + len(SECTION_END) + 1 :]
    anchor = results_md.find("## Reading these numbers")
    if anchor == -1:
        return results_md.rstrip("\n") + "\n\n" + section
    return results_md[:anchor] + section + "\n" + results_md[anchor:]


def kept_section(results_md: str) -> str | None:
    """The source-selector section of an existing RESULTS.md, for a rewrite to carry over."""
    start, end = results_md.find(SECTION_START), results_md.find(SECTION_END)
    if start == -1 or end == -1:
        return None
    return results_md[start : end + len(SECTION_END)] + "\n"


if __name__ == "__main__":
    sys.exit(main())
