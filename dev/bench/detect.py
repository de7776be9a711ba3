"""Measurement 4: detect-failures throughput, in-process on one core and over HTTP.

The corpus is real ApiServerSource pod events (Knative's adapter watching the local cluster's
pods during the recovery benchmark: healthy pods and crash-looping ones), kept in
``dev/bench/corpus/pod-events.jsonl.gz`` (structured mode, as the Broker's archive Trigger keeps
them). Each event is sent the way the Broker delivers it: binary mode, ``ce-*`` headers and the
pod JSON as the body.

In-process, pinned to one core, three tiers per event:

- ``json_floor``: ``json.loads`` of the body only, the least any Python consumer must do;
- ``parse_and_detect``: ``shared.platform.events.parse`` (the CloudEvents SDK) then
  ``shared.pods.detect_failures.decide.detect``, which is what the function does per event short of
  HTTP and logging;
- ``detect_only``: ``detect`` on an already parsed event (the classification itself).

Over HTTP: detect-failures served by its image's command (gunicorn, gthread, the shipped
settings, logging at INFO as deployed), driven by a thread pool of keep-alive connections on
loopback. The load generator shares the machine's two cores with the server, so the server's
own CPU seconds are read from /proc and events per server CPU-second are reported beside the
wall-clock rate.
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dev.bench.common import CORPUS_FILE, JSON, Scales, cpu_seconds, ratio, summary
from dev.stack.functions import FunctionServer
from shared.api.keys import EVENT_POD_FAILING
from shared.platform import events
from shared.platform.config import Config
from shared.pods.detect_failures.decide import detect

Binary = tuple[dict[str, str], bytes]


def load_corpus(path: Path = CORPUS_FILE) -> list[JSON]:
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def to_binary(event: JSON) -> Binary:
    """Binary-mode HTTP headers and body, as the Broker delivers an ApiServerSource event."""
    headers = {"content-type": event.get("datacontenttype", "application/json")}
    for key, value in event.items():
        if key in ("data", "datacontenttype", "data_base64"):
            continue
        headers[f"ce-{key}"] = str(value)
    return headers, json.dumps(event["data"], separators=(",", ":")).encode()


def expand(corpus: list[JSON], n: int) -> list[Binary]:
    """``n`` binary events cycling through the corpus, each with its own id."""
    out = []
    for i in range(n):
        headers, body = to_binary(corpus[i % len(corpus)])
        headers["ce-id"] = f"bench-{i}"
        out.append((headers, body))
    return out


def _rate(fn: Callable[[], None], count: int, rounds: int) -> JSON:
    rates = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        rates.append(count / (time.perf_counter() - t))
    return {"events_per_s": round(statistics.median(rates), 1), "rounds": [round(r) for r in rates]}


def in_process(binaries: list[Binary], rounds: int) -> JSON:
    cfg = Config()
    parsed = [events.parse(h, b) for h, b in binaries]
    failing = sum(1 for e in parsed if detect(e, cfg) is not None)
    cpu = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu[-1]})
    try:

        def floor() -> None:
            for _, body in binaries:
                json.loads(body)

        def full() -> None:
            for headers, body in binaries:
                detect(events.parse(headers, body), cfg)

        def only() -> None:
            for event in parsed:
                detect(event, cfg)

        floor()  # warm up
        result: dict[str, Any] = {
            "json_floor": _rate(floor, len(binaries), rounds),
            "parse_and_detect": _rate(full, len(binaries), rounds),
            "detect_only": _rate(only, len(binaries), rounds),
        }
    finally:
        os.sched_setaffinity(0, set(cpu))
    fl = result["json_floor"]["events_per_s"]
    pd = result["parse_and_detect"]["events_per_s"]
    result["events"] = len(binaries)
    result["failing_share"] = round(failing / len(parsed), 3)
    result["mean_body_bytes"] = round(statistics.fmean(len(b) for _, b in binaries))
    result["cost_vs_floor"] = ratio(fl, pd)  # time per event relative to json.loads alone
    result["pinned_to_cpu"] = cpu[-1]
    return result


def over_http(
    binaries: list[Binary], concurrency: int, log_dir: Path, log_level: str = "INFO"
) -> JSON:
    env = {"KUBECONFIG": os.devnull, "KN_RESCHEDULER_LOG_LEVEL": log_level}
    server = FunctionServer("detect-failures", log_dir, env=env).start()
    try:
        assert server.proc is not None
        pid = server.proc.pid
        # Warm-up: every worker thread and code path once.
        _drive(server.port, binaries[: min(200, len(binaries))], concurrency)
        cpu_before = cpu_seconds(pid)
        t = time.perf_counter()
        latencies, statuses, replies = _drive(server.port, binaries, concurrency)
        wall = time.perf_counter() - t
        cpu = cpu_seconds(pid) - cpu_before
    finally:
        server.stop()
    return {
        "requests": len(binaries),
        "concurrency": concurrency,
        "events_per_s": round(len(binaries) / wall, 1),
        "server_cpu_s": round(cpu, 2),
        "events_per_server_cpu_s": round(len(binaries) / cpu, 1) if cpu else None,
        "latency_ms": summary(latencies, 1000.0),
        "statuses": statuses,
        "failing_replies": replies,
        "log_level": log_level,
    }


def _drive(port: int, binaries: list[Binary], concurrency: int) -> tuple[list[float], JSON, int]:
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    replies = 0
    lock = threading.Lock()
    cursor = iter(range(len(binaries)))

    def worker() -> None:
        nonlocal replies
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        mine: list[float] = []
        seen: dict[str, int] = {}
        got = 0
        while True:
            with lock:
                i = next(cursor, None)
            if i is None:
                break
            headers, body = binaries[i]
            t = time.perf_counter()
            try:
                conn.request("POST", "/", body=body, headers=headers)
                resp = conn.getresponse()
                resp.read()
                status = str(resp.status)
                if resp.getheader("ce-type") == EVENT_POD_FAILING:
                    got += 1
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                status = "error"
            mine.append(time.perf_counter() - t)
            seen[status] = seen.get(status, 0) + 1
        conn.close()
        with lock:
            latencies.extend(mine)
            replies += got
            for k, v in seen.items():
                statuses[k] = statuses.get(k, 0) + v

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return latencies, statuses, replies


def measure(scales: Scales, workdir: Path, *, log: Callable[[str], None]) -> JSON:
    corpus = load_corpus()
    binaries = expand(corpus, scales.corpus_events)
    log(f"detect: in-process, {len(binaries)} events from a corpus of {len(corpus)}")
    inproc = in_process(binaries, scales.inprocess_rounds)
    log(
        f"  in-process {inproc['parse_and_detect']['events_per_s']:.0f} events/s, "
        f"floor {inproc['json_floor']['events_per_s']:.0f}/s"
    )
    http_binaries = expand(corpus, scales.http_requests)
    log(f"detect: over HTTP, {len(http_binaries)} requests, {scales.http_concurrency} connections")
    workdir.mkdir(parents=True, exist_ok=True)
    http_result = over_http(http_binaries, scales.http_concurrency, workdir)
    log(
        f"  HTTP {http_result['events_per_s']:.0f} events/s, "
        f"p99 {http_result['latency_ms']['p99']} ms"
    )
    log("detect: over HTTP again with log level WARNING (no per-event log line)")
    quiet = over_http(http_binaries, scales.http_concurrency, workdir, "WARNING")
    log(f"  HTTP (WARNING) {quiet['events_per_s']:.0f} events/s, p99 {quiet['latency_ms']['p99']}")
    result: dict[str, Any] = {
        "corpus": {
            "file": str(CORPUS_FILE.relative_to(CORPUS_FILE.parents[3])),
            "distinct_events": len(corpus),
        },
        "in_process": inproc,
        "http": http_result,
        "http_quiet": quiet,
    }
    return result
