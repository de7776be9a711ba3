"""Installing Knative Eventing from ko's output: which images a manifest names, and when an
install step may go on.

tests/e2e/test_knative_installed.py runs the install on a cluster of real nodes.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dev.localcluster import knative
from dev.stack import installed

DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64

# Shaped as ko resolve writes them (default naming: <command>-<md5 of the import path>).
MANIFEST = f"""
apiVersion: apps/v1
kind: Deployment
metadata:
  name: eventing-controller
spec:
  template:
    spec:
      containers:
        - name: eventing-controller
          image: kn-rescheduler.local/knative/controller-f6fa1d3ea4fb4ca5c94e23e4e0ef5f21@{DIGEST_A}
          env:
            - name: APISERVER_RA_IMAGE
              value: kn-rescheduler.local/knative/apiserver_receive_adapter-aa8c@{DIGEST_B}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: second
spec:
  template:
    spec:
      containers:
        - image: kn-rescheduler.local/knative/controller-f6fa1d3ea4fb4ca5c94e23e4e0ef5f21@{DIGEST_A}
        - image: registry.k8s.io/coredns/coredns:v1.14.2
"""


def test_every_image_ko_wrote_is_found_once_with_its_digest() -> None:
    assert knative.images(MANIFEST) == [
        knative.Image("knative/controller-f6fa1d3ea4fb4ca5c94e23e4e0ef5f21", DIGEST_A),
        # An image named in an environment variable (the adapter the controller deploys).
        knative.Image("knative/apiserver_receive_adapter-aa8c", DIGEST_B),
    ]


def test_an_image_by_tag_or_from_elsewhere_is_not_ours_to_push() -> None:
    assert knative.images("image: kn-rescheduler.local/knative/controller:latest\n") == []
    assert knative.images("image: registry.k8s.io/coredns/coredns:v1.14.2\n") == []


def deployment(name: str, replicas: int | None, available: int | None) -> dict[str, Any]:
    d: dict[str, Any] = {"metadata": {"name": name}, "spec": {}, "status": {}}
    if replicas is not None:
        d["spec"]["replicas"] = replicas
    if available is not None:
        d["status"]["availableReplicas"] = available
    return d


def test_a_step_waits_for_every_deployment_that_wants_a_replica() -> None:
    deployments = [
        deployment("eventing-webhook", 1, None),
        deployment("eventing-controller", 1, 1),
        # Scaled by its controller once a PingSource exists: nothing to wait for.
        deployment("pingsource-mt-adapter", 0, None),
        deployment("job-sink", None, 0),
    ]
    assert knative.unavailable(deployments) == ["eventing-webhook", "job-sink"]
    assert knative.unavailable([deployment("eventing-webhook", 1, 1)]) == []


# -- the dead-letter sink on the cluster here ---------------------------------------------------

REPO = Path(__file__).resolve().parents[2]


def test_the_sink_here_runs_the_event_display_installed_here_under_its_release_name() -> None:
    here = knative.event_display_reference(DIGEST_A)
    # knative/ names the sink by its release name and the digest of a released image, which
    # the registry here cannot hold: the same name, another digest.
    for manifest in (
        REPO / "knative" / "dead-letters.yaml",
        REPO / "knative" / "components" / "without-serving" / "functions.yaml",
    ):
        (pinned,) = re.findall(r"image: (\S+event_display\S*)", manifest.read_text())
        assert pinned.partition("@")[0] == here.partition("@")[0], manifest
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", pinned.partition("@")[2]), manifest
        assert pinned != here
    # And the deploy targets' override replaces exactly that name.
    (name,) = re.findall(
        r"^KNR_EVENT_DISPLAY := (\S+)$", (REPO / "hack" / "deploy.mk").read_text(), re.M
    )
    assert name == here.partition("@")[0]


@pytest.mark.parametrize("event_display", [None, knative.event_display_reference(DIGEST_B)])
def test_a_deploy_here_pins_the_sink_once_eventing_is_installed(event_display: str | None) -> None:
    cluster: Any = SimpleNamespace(
        registry=SimpleNamespace(host="127.0.0.1:5000"),
        event_display=event_display,
        bins_dir=Path("/bins"),
        kubeconfig=Path("/kubeconfig"),
    )
    variables = installed.deploy_variables(cluster, ".local/deploy-test")
    assert variables.get("DEAD_LETTERS_IMAGE") == event_display
    assert variables["REGISTRY"] == "127.0.0.1:5000/kn-rescheduler"
