"""Handler tests: each function exactly as functions-framework serves it, through Flask's test
client. Requests are real HTTP requests as far as the function can tell; CloudEvents are built
with the CloudEvents SDK in binary and structured mode like a Broker would send them."""

from __future__ import annotations

import json
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import flask.testing
import functions_framework
import pytest
from cloudevents.conversion import to_binary, to_structured
from cloudevents.http import CloudEvent

ROOT = Path(__file__).resolve().parents[2]

ClientFactory = Callable[..., flask.testing.FlaskClient]

# Tests tick a function on demand, one tick right after another: no bound between runs
# (production's is tested in tests/handlers/test_ticks.py).
ON_DEMAND_TICKS: Final = {"KN_RESCHEDULER_MIN_TICK_INTERVAL": "0s"}


def settings(name: str, kubeconfig: Path, **more: str) -> dict[str, str]:
    """What function ``name`` needs to start, nobody listening behind it: its API server
    (``kubeconfig``), sweep-failures' sink, the node functions' Prometheus."""
    env = {"KUBECONFIG": str(kubeconfig), "K_SINK": "http://127.0.0.1:9", **more}
    if name in ("label-nodes", "annotate-usage", "rebalance-nodes"):
        env.setdefault("KN_RESCHEDULER_PROMETHEUS_URL", "http://127.0.0.1:9")
    return env


@pytest.fixture
def function_client(monkeypatch: pytest.MonkeyPatch) -> Iterator[ClientFactory]:
    """A test client for functions/NAME/main.py, loaded with the given environment."""

    stops: list[threading.Event] = []

    def make(name: str, **env: str) -> flask.testing.FlaskClient:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        app = functions_framework.create_app(
            target="handle", source=str(ROOT / "functions" / name / "main.py")
        )
        # functions-framework loads the source as the module "main"; a background thread it
        # started (score-nodes' node cache) is stopped when the test ends, not left to log
        # into the next test's captured output.
        stop = getattr(sys.modules.get("main"), "NODE_CACHE_STOP", None)
        if isinstance(stop, threading.Event):
            stops.append(stop)
        return app.test_client()

    yield make
    for stop in stops:
        stop.set()


def cloudevent(
    event_type: str, data: Any, *, structured: bool = False, **attributes: str
) -> tuple[dict[str, str], bytes]:
    attrs = {"type": event_type, "source": "https://127.0.0.1:6443", **attributes}
    event = CloudEvent(attrs, data)
    headers, body = to_structured(event) if structured else to_binary(event)
    return dict(headers), body


def reply_of(response: Any) -> tuple[dict[str, str], Any]:
    """The CloudEvent attributes (from ce- headers) and JSON data of a binary-mode reply."""
    attrs = {k[3:].lower(): v for k, v in response.headers.items() if k.lower().startswith("ce-")}
    return attrs, json.loads(response.data)


@pytest.fixture
def unreachable_kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig pointing at a loopback port nobody listens on: every API call is refused,
    which is a real transient failure, not a mock."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = tmp_path / "kubeconfig"
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {{server: "https://127.0.0.1:{port}", insecure-skip-tls-verify: true}}
users: [{{name: u, user: {{token: nothing}}}}]
contexts: [{{name: c, context: {{cluster: c, user: u}}}}]
current-context: c
"""
    )
    return path
