"""sweep-failures' own identity toward the Broker (shared.platform.senders.sink_token).

With Eventing's OIDC on, the Broker's ingress refuses a post without a token for its audience;
the kubelet writes one into the projected volume knative/sweep-failures.yaml mounts and
replaces it before it expires. The sweep reads it again for every post and sends it as a
bearer token; without one mounted it posts as before.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from shared.platform.config import Config
from shared.platform.senders import SINK_TOKEN_PATH, sink_token
from shared.pods.failing import FailingPod
from shared.pods.sweep_failures.handler import Sweeper
from shared.workloads.classify import Failure, FailureKind

from .pods import running


class Posted:
    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []

    def __call__(self, url: str, *, data: bytes, headers: dict[str, str], timeout: float) -> Any:
        json.loads(data)
        self.headers.append(dict(headers))
        return type("Answer", (), {"status_code": 202})()


def failing() -> FailingPod:
    failure = Failure(
        kind=FailureKind.NODE_FIXABLE,
        reason="StuckPending",
        message="StuckPending on node-b",
        node="node-b",
        ran_for_seconds=0,
        why="stuck",
    )
    return FailingPod.from_pod(running(), failure)


def sent_with(token: Any) -> dict[str, str]:
    posted = Posted()
    sweeper = Sweeper(None, Config(), "http://broker.invalid/", post=posted, token=token)  # type: ignore[arg-type]
    assert sweeper._send(failing())
    (headers,) = posted.headers
    return headers


def test_the_sweep_sends_the_mounted_token_as_a_bearer_token(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("eyJ.first.sig\n")
    read = sink_token(str(path))
    assert sent_with(read)["Authorization"] == "Bearer eyJ.first.sig"
    # The kubelet replaces the file before the token expires: the next post sends the new one.
    path.write_text("eyJ.second.sig")
    assert sent_with(read)["Authorization"] == "Bearer eyJ.second.sig"


def test_without_a_mounted_token_the_sweep_posts_without_one(tmp_path: Path) -> None:
    assert "Authorization" not in sent_with(sink_token(str(tmp_path / "absent")))
    (tmp_path / "empty").write_text("\n")
    assert "Authorization" not in sent_with(sink_token(str(tmp_path / "empty")))
    # The CloudEvent itself is unchanged either way.
    assert sent_with(sink_token(str(tmp_path / "absent")))["ce-type"]


def test_the_token_is_read_where_the_manifest_mounts_it_for_the_brokers_audience() -> None:
    root = Path(__file__).resolve().parents[2]
    (ksvc,) = yaml.safe_load_all((root / "knative" / "sweep-failures.yaml").read_text())
    spec = ksvc["spec"]["template"]["spec"]
    (mount,) = spec["containers"][0]["volumeMounts"]
    assert Path(mount["mountPath"]) / "token" == Path(SINK_TOKEN_PATH)
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    (source,) = volume["projected"]["sources"]
    token = source["serviceAccountToken"]
    assert token["path"] == "token"
    # Eventing's audience of the Broker the sink URL names (pkg/auth: group/kind/ns/name).
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    namespace, broker = env["K_SINK"].rstrip("/").split("/")[-2:]
    assert token["audience"] == f"eventing.knative.dev/broker/{namespace}/{broker}"


def test_what_is_not_a_token_is_not_sent_and_not_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="shared.platform.senders")
    logging.getLogger("shared.platform.senders").addHandler(caplog.handler)
    cases = {
        "crlf": b"eyJ.secret\r\nX-Injected: yes",
        "latin": b"eyJ.\xff\xfe.sig",
        "huge": b"a" * 20000,
    }
    for name, content in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        assert sink_token(str(path))() is None, name
        assert "Authorization" not in sent_with(sink_token(str(path)))
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "secret" not in logged and "Injected" not in logged
    assert "is not a token" in logged


def test_the_sweep_posts_to_the_sink_alone_without_the_environments_proxy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A proxy set in the environment (the settings ConfigMap reaches every function) would
    receive the Authorization header: the sweep's own poster ignores it."""
    seen: dict[str, Any] = {}

    def send(self: requests.Session, request: Any, **kwargs: Any) -> Any:
        seen["proxies"] = kwargs.get("proxies")
        seen["allow_redirects"] = kwargs.get("allow_redirects")
        seen["trust_env"] = self.trust_env
        return type("Answer", (), {"status_code": 202})()

    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setattr(requests.Session, "send", send)
    sweeper = Sweeper(None, Config(), "http://broker.invalid/", token=lambda: "eyJ.a.b")  # type: ignore[arg-type]
    assert sweeper._send(failing())
    assert seen["trust_env"] is False
    assert not seen["proxies"]
    assert seen["allow_redirects"] is False
