"""The Broker benches' own parts: Triggers moved to a namespace, events counted from a Broker's
archive, and the recording and failing subscribers of ``--only broker``."""

from __future__ import annotations

import json
from pathlib import Path

import requests
import yaml

from dev.bench import broker as bench_broker
from dev.bench.common import ROOT, broker_manifests
from dev.bench.selector import DETECT_FILTER, source_events
from kubectl_kn_rescheduler.routing import triggers


def test_the_shipped_broker_and_triggers_move_to_another_namespace(tmp_path: Path) -> None:
    broker_manifests("elsewhere", tmp_path)
    docs = list(yaml.safe_load_all((tmp_path / "broker.yaml").read_text()))
    assert {d["kind"] for d in docs} == {"Broker", "Trigger"}
    assert {d["metadata"]["namespace"] for d in docs} == {"elsewhere"}
    found, broker = triggers.load(tmp_path, namespace="elsewhere", broker="default")
    assert broker is not None
    shipped, _ = triggers.load(ROOT / "knative", namespace="kn-rescheduler", broker="default")
    assert sorted(t.name for t in found) == sorted(t.name for t in shipped)


def _archived(path: Path, *events: dict[str, str]) -> Path:
    path.write_text("".join(json.dumps({"specversion": "1.0", **e}) + "\n" for e in events))
    return path


def test_the_archive_counts_source_events_and_those_detect_failures_gets(tmp_path: Path) -> None:
    archive = _archived(
        tmp_path / "archive.jsonl",
        {"type": "dev.knative.apiserver.resource.add", "kind": "Pod"},
        {"type": "dev.knative.apiserver.resource.update", "kind": "Pod"},
        # Deletes are sent but kept from detect-failures by its Trigger.
        {"type": "dev.knative.apiserver.resource.delete", "kind": "Pod"},
        # A function's reply is archived too, but the adapter did not send it.
        {"type": "io.kn-rescheduler.pod.failing", "kind": "Pod"},
    )
    assert source_events(archive, DETECT_FILTER) == (3, 2)
    assert source_events(tmp_path / "missing.jsonl", DETECT_FILTER) == (0, 0)


def test_the_failing_trigger_is_detect_failures_own_with_another_subscriber(
    tmp_path: Path,
) -> None:
    bench_broker.manifests(tmp_path)
    found, _ = triggers.load(tmp_path, namespace=bench_broker.NAMESPACE, broker="default")
    by_name = {t.name: t for t in found}
    recorder, failing = by_name[bench_broker.RECORDER], by_name[bench_broker.FAILING]
    assert failing.subscriber.service == bench_broker.FAILING
    assert failing.delivery == recorder.delivery
    assert failing.delivery is not None and failing.delivery.retry == 5
    headers, _ = bench_broker.pod_event("1")
    attrs = {k[3:]: v for k, v in headers.items() if k.startswith("ce-")}
    assert failing.filter(attrs).delivers and recorder.filter(attrs).delivers


def test_the_failing_subscriber_fails_only_the_events_it_is_told_to() -> None:
    sub = bench_broker.Subscriber("failing", fail={"bad"}).start()
    try:
        statuses = {}
        for seq in ("good", "bad", "bad"):
            headers, body = bench_broker.pod_event(seq)
            statuses[seq] = requests.post(sub.url, data=body, headers=headers, timeout=5)
        assert statuses["good"].status_code == 202
        assert statuses["bad"].status_code == 500
        assert sub.attempts == {"good": 1, "bad": 2}
        assert sub.wait("good", 1) == sub.arrived["good"]
        assert sub.wait("never sent", 0.05) is None
    finally:
        sub.stop()
