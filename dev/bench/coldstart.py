"""Measurement 7: cold start, from process start to the first answered event, per function.

Each function is spawned with its image's command (gunicorn + functions-framework, see
``stack.functions.command``) and the environment the local stack gives it; from the moment of
the spawn a real event is POSTed every 20 ms until one is answered with a 2xx:

- detect-failures: an ApiServerSource pod event from the corpus;
- update-annotations: an ``io.kn-rescheduler.pod.failing`` event for a pod that does not exist
  (it looks the pod up and answers 202);
- mutate-admission (TLS): an AdmissionReview of a pod with no owner;
- sweep-failures: a PingSource event (it lists every pod of the cluster).

What Knative adds on a real cluster (image pull, container start, queue-proxy, activator) is not
part of this number: it is the function process's own share of a cold start.
"""

from __future__ import annotations

import json
import ssl
import statistics
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from dev.bench.common import JSON, Scales
from dev.bench.detect import load_corpus, to_binary
from dev.localcluster.cluster import Cluster
from dev.localcluster.procs import Proc
from dev.stack.functions import ROOT, command, environment, free_port
from dev.stack.webhook import make_tls
from shared.api.keys import EVENT_POD_FAILING
from shared.platform import events
from shared.platform.config import Config
from shared.pods.detect_failures.decide import detect

Request = tuple[dict[str, str], bytes]


def _requests() -> dict[str, Request]:
    corpus = load_corpus()
    cfg = Config()
    pod_event = to_binary(corpus[0])
    failing: JSON | None = None
    for e in corpus:
        headers, body = to_binary(e)
        reply = detect(events.parse(headers, body), cfg)
        if reply is not None:
            failing = dict(reply.data)
            break
    if failing is None:
        raise RuntimeError("the corpus has no failing pod event")
    failing["namespace"] = "bench-cold-start-nowhere"
    failing_headers = {
        "ce-specversion": "1.0",
        "ce-id": "bench-cold-start",
        "ce-source": "/kn-rescheduler/detect-failures",
        "ce-type": EVENT_POD_FAILING,
        "ce-subject": f"/apis/v1/namespaces/bench-cold-start-nowhere/pods/{failing.get('name')}",
        "content-type": "application/json",
    }
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "bench-cold-start",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "namespace": "default",
            "operation": "CREATE",
            "object": {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "cold", "namespace": "default"},
                "spec": {"containers": [{"name": "app", "image": "registry.example.com/a:1"}]},
            },
        },
    }
    ping_headers = {
        "ce-specversion": "1.0",
        "ce-id": "bench-cold-start",
        "ce-source": "/apis/v1/namespaces/kn-rescheduler/pingsources/sweep-failures",
        "ce-type": "dev.knative.sources.ping",
        "content-type": "application/json",
    }
    return {
        "detect-failures": pod_event,
        "update-annotations": (failing_headers, json.dumps(failing).encode()),
        "mutate-admission": ({"content-type": "application/json"}, json.dumps(review).encode()),
        "sweep-failures": (ping_headers, json.dumps({"message": "sweep"}).encode()),
    }


def once(cluster: Cluster, function: str, request: Request, workdir: Path) -> float:
    port = free_port()
    env = {
        "PYTHONPATH": str(ROOT),
        "HOST": "127.0.0.1",
        "PORT": str(port),
        **environment(cluster.kubeconfig, K_SINK="http://127.0.0.1:9/"),
    }
    context = None
    scheme = "http"
    if function == "mutate-admission":
        ca, crt, key = make_tls(workdir / "tls")
        env["TLS_CERT_FILE"], env["TLS_KEY_FILE"] = str(crt), str(key)
        context = ssl.create_default_context(cafile=str(ca))
        scheme = "https"
    headers, body = request
    url = f"{scheme}://127.0.0.1:{port}/"
    t0 = time.monotonic()
    proc = Proc(function, command(function), workdir / f"{function}.log", env=env, cwd=ROOT)
    try:
        while time.monotonic() - t0 < 60:
            if not proc.alive():
                raise RuntimeError(f"{function} exited:\n{proc.log_tail()}")
            try:
                req = urllib.request.Request(url, data=body, headers=headers, method="POST")
                with urllib.request.urlopen(req, timeout=30, context=context) as resp:
                    if 200 <= resp.status < 300:
                        return time.monotonic() - t0
            except urllib.error.HTTPError as e:
                raise RuntimeError(f"{function} answered {e.code}: {e.read()[:300]!r}") from e
            except OSError:
                pass
            time.sleep(0.02)
        raise TimeoutError(f"{function} did not answer within 60 s")
    finally:
        proc.stop(grace=5.0)


def measure(cluster: Cluster, scales: Scales, workdir: Path, *, log: Callable[[str], None]) -> JSON:
    workdir.mkdir(parents=True, exist_ok=True)
    result: JSON = {}
    for function, request in _requests().items():
        runs = [once(cluster, function, request, workdir) for _ in range(scales.cold_start_runs)]
        result[function] = {
            "runs_s": [round(r, 3) for r in runs],
            "median_s": round(statistics.median(runs), 3),
        }
        log(f"cold start: {function} {result[function]['median_s']} s")
    return result
