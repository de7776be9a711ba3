"""Replaying a finished demo's archive: what needs no cluster replays, the rest says why not.

A newcomer's first archive is the one `make demo` leaves behind, and its cluster is gone by
then. detect-failures judges a pod event from the event alone, so those replay anywhere;
update-annotations and assess-nodes read and write a cluster, so replay checks once, before the
first event, that there is one, and when there is none says so once, with how to get one,
instead of a client traceback per event. The tool runs here as its users run it (a
subprocess), on an excerpt of a real demo archive (tests/fixtures/README.md).
"""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kubectl_kn_rescheduler import replay
from shared.api.keys import (
    APISERVER_UPDATE,
    EVENT_POD_EXHAUSTED,
    EVENT_POD_FAILING,
    EVENT_POD_RESCHEDULED,
)

ROOT = Path(__file__).resolve().parents[2]
ARCHIVE = ROOT / "tests" / "fixtures" / "demo-archive.jsonl"
SAID_ONCE = "read and write a Kubernetes cluster, and there is none"


def run_replay(kubeconfig: Path | None, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")
    }
    env["HOME"] = str(home)  # no ~/.kube/config of the machine's to fall back on
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    return subprocess.run(
        [sys.executable, "-m", "kubectl_kn_rescheduler.replay", str(ARCHIVE), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def write_kubeconfig(path: Path, server: str) -> Path:
    # JSON is YAML: the client reads this as any kubeconfig.
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "gone", "cluster": {"server": server}}],
                "users": [{"name": "me", "user": {"token": "not-a-secret"}}],
                "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "me"}}],
                "current-context": "gone",
            }
        )
    )
    return path


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def archived_types() -> list[str]:
    return [json.loads(line)["type"] for line in ARCHIVE.read_text().splitlines() if line]


def test_the_fixture_holds_pod_events_and_the_events_that_need_a_cluster() -> None:
    types = archived_types()
    assert types.count(APISERVER_UPDATE) >= 3
    assert types.count(EVENT_POD_FAILING) >= 3
    assert EVENT_POD_RESCHEDULED in types


def test_with_a_missing_kubeconfig_the_pod_events_replay_and_the_rest_is_said_once(
    tmp_path: Path,
) -> None:
    result = run_replay(tmp_path / "no-such-kubeconfig", tmp_path)
    output = result.stdout + result.stderr
    assert "Traceback" not in output
    assert result.returncode == replay.NO_CLUSTER, output
    assert result.stderr.count(SAID_ONCE) == 1, result.stderr
    assert f"KUBECONFIG={tmp_path / 'no-such-kubeconfig'}: no such file" in result.stderr
    assert "make up" in result.stderr and "KUBECONFIG=.local/kubeconfig" in result.stderr
    # detect-failures judged the demo's pod events again and found the failures it found then.
    assert "-> detect-failures: HTTP 200" in result.stdout
    assert "decision: failing: " in result.stdout
    assert "update-annotations" not in result.stdout and "assess-nodes" not in result.stdout
    acting = (EVENT_POD_FAILING, EVENT_POD_RESCHEDULED, EVENT_POD_EXHAUSTED)
    needing = len([t for t in archived_types() if t in acting])
    assert f", {needing} skipped (no cluster)" in result.stdout


def test_with_a_kubeconfig_whose_server_is_gone_nothing_is_replayed_and_it_says_why(
    tmp_path: Path,
) -> None:
    port = closed_port()
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"https://127.0.0.1:{port}")
    result = run_replay(kubeconfig, tmp_path, "--type", EVENT_POD_FAILING)
    output = result.stdout + result.stderr
    assert "Traceback" not in output and "ConfigException" not in output
    assert result.returncode == replay.NO_CLUSTER, output
    assert result.stderr.count(SAID_ONCE) == 1, result.stderr
    assert f"(https://127.0.0.1:{port}) does not answer" in result.stderr
    assert "make up" in result.stderr
    assert "nothing replayed" in result.stderr
    assert "HTTP" not in result.stdout  # not one event was sent to a function


def test_the_pod_events_alone_need_no_cluster_and_exit_0(tmp_path: Path) -> None:
    result = run_replay(None, tmp_path, "--type", APISERVER_UPDATE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert SAID_ONCE not in result.stderr
    assert "0 failed" in result.stdout


class _ApiServer(BaseHTTPRequestHandler):
    """Answers /version like an API server, and 404 for any object: the demo's pods are gone."""

    def do_GET(self) -> None:
        self.server.paths.append(self.path)  # type: ignore[attr-defined]
        if self.path == "/version":
            status, body = 200, {"major": "1", "minor": "31", "gitVersion": "v1.31.0"}
        else:
            status, body = 404, {"kind": "Status", "reason": "NotFound", "code": 404}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def api_server() -> Iterator[tuple[str, list[str]]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ApiServer)
    paths: list[str] = []
    server.paths = paths  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", paths
    finally:
        server.shutdown()
        server.server_close()


def test_with_a_cluster_there_the_events_go_to_the_functions_that_act_checked_once(
    tmp_path: Path, api_server: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, paths = api_server
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", url)))
    out = io.StringIO()
    status = replay.main([str(ARCHIVE), "--type", EVENT_POD_FAILING, "--json"], out=out)
    outcomes = [json.loads(line) for line in out.getvalue().splitlines()]
    assert status == 0, outcomes
    assert {o["function"] for o in outcomes} == {"update-annotations", "assess-nodes"}
    assert all(200 <= o["status"] < 300 for o in outcomes), outcomes
    # The functions looked the demo's objects up on the server; /version was asked once.
    assert paths.count("/version") == 1
    assert any(p.startswith("/api/v1/namespaces/demo/pods/") for p in paths), paths
