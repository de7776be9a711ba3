"""hack/webhook-cert.sh --apply puts the CA into every webhook of the configuration.

Run against a kubectl that records its calls and answers as the API server would for the
configuration knative/ installs (two webhooks: pods, and Jobs for their disruption policy). A
webhook without the caBundle is never verified, and with failurePolicy Ignore its objects are
admitted silently without it: the script once patched only the first.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "webhook-cert.sh"

FAKE_KUBECTL = """#!/usr/bin/env bash
# Records each call; answers the webhook list the way `kubectl get -o jsonpath` prints it.
printf '%s\\n' "$*" >> "$CALLS"
if [[ $1 == get ]]; then printf '%s' "$WEBHOOKS"; fi
if [[ $1 == create ]]; then echo 'apiVersion: v1'; fi
exit 0
"""


def shipped_webhooks() -> list[str]:
    docs = yaml.safe_load_all((ROOT / "knative" / "webhook.yaml").read_text())
    (config,) = [d for d in docs if d and d.get("kind") == "MutatingWebhookConfiguration"]
    return [w["name"] for w in config["webhooks"]]


def apply(tmp_path: Path, webhooks: list[str]) -> tuple[subprocess.CompletedProcess[str], str]:
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(FAKE_KUBECTL)
    kubectl.chmod(0o755)
    calls = tmp_path / "calls"
    env = {
        **os.environ,
        "KUBECTL": str(kubectl),
        "CALLS": str(calls),
        "WEBHOOKS": "".join(f"{name}\n" for name in webhooks),
    }
    done = subprocess.run(
        ["bash", str(SCRIPT), "--out", str(tmp_path / "tls"), "--apply"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    return done, calls.read_text() if calls.exists() else ""


pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed")


def test_every_shipped_webhook_gets_the_ca(tmp_path: Path) -> None:
    names = shipped_webhooks()
    assert len(names) >= 2  # pods, and Jobs
    done, calls = apply(tmp_path, names)
    assert done.returncode == 0, done.stderr
    (patch_call,) = [c for c in calls.splitlines() if c.startswith("patch ")]
    ops = json.loads(patch_call.split(" -p ", 1)[1])
    assert [op["path"] for op in ops] == [
        f"/webhooks/{i}/clientConfig/caBundle" for i in range(len(names))
    ]
    ca = (tmp_path / "tls" / "ca.crt").read_bytes()
    assert {op["value"] for op in ops} == {base64.b64encode(ca).decode()}


def test_a_configuration_not_applied_yet_is_said_and_nothing_patched(tmp_path: Path) -> None:
    done, calls = apply(tmp_path, [])
    assert done.returncode == 1
    assert "apply knative/ first" in done.stderr
    assert not [c for c in calls.splitlines() if c.startswith("patch ")]
