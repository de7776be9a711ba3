"""kn-rescheduler without Knative Serving: the generated component stays what the Knative
Services are, as Deployments and Services (dev/tools/without_serving.py).

tests/e2e/test_installed.py installs it on a cluster of real nodes with Knative Eventing.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from dev.tools import without_serving

ROOT = Path(__file__).resolve().parents[2]


def generated() -> list[dict[str, Any]]:
    text = (without_serving.COMPONENT / "functions.yaml").read_text()
    return [d for d in yaml.safe_load_all(text) if d]


def test_the_committed_component_is_what_the_generator_writes() -> None:
    assert without_serving.main(["--check"]) == 0


def test_every_knative_service_but_the_webhook_becomes_a_deployment_and_a_service() -> None:
    ksvcs = {k["metadata"]["name"] for k in without_serving.knative_services()}
    objects = generated()
    deployments = {o["metadata"]["name"] for o in objects if o["kind"] == "Deployment"}
    services = {o["metadata"]["name"] for o in objects if o["kind"] == "Service"}
    assert deployments == services == ksvcs - {"mutate-admission"}
    assert "detect-failures" in deployments and "dead-letters" in deployments


def test_each_deployment_runs_the_knative_services_container_and_pod_settings() -> None:
    by_name = {k["metadata"]["name"]: k for k in without_serving.knative_services()}
    for obj in generated():
        if obj["kind"] != "Deployment":
            continue
        revision = by_name[obj["metadata"]["name"]]["spec"]["template"]["spec"]
        pod = obj["spec"]["template"]["spec"]
        # The same container, its port named as Knative names a Revision's user port.
        expected = copy.deepcopy(revision["containers"])
        for port in expected[0].get("ports", []):
            port["name"] = "user-port"
        assert pod["containers"] == expected
        assert pod.get("serviceAccountName") == revision.get("serviceAccountName")
        # What only Knative's queue-proxy and activator read is not a PodSpec field.
        assert not set(pod) & {"containerConcurrency", "timeoutSeconds"}
        labels = obj["spec"]["template"]["metadata"]["labels"]
        assert obj["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_each_service_answers_on_port_80_as_a_knative_services_address_does() -> None:
    objects = generated()
    ports = {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]["containers"][0]["ports"][0]
        for o in objects
        if o["kind"] == "Deployment"
    }
    for svc in (o for o in objects if o["kind"] == "Service"):
        (port,) = svc["spec"]["ports"]
        assert port["port"] == 80
        assert port["targetPort"] == ports[svc["metadata"]["name"]]["containerPort"]


def test_every_reference_to_a_knative_service_is_patched_to_the_core_service() -> None:
    kust = yaml.safe_load((without_serving.COMPONENT / "kustomization.yaml").read_text())
    patched = {
        (p["target"]["kind"], p["target"]["name"])
        for p in kust["patches"]
        if "target" in p and "apiVersion" in p["patch"]
    }
    refering = set()
    for obj in without_serving.base_objects():
        for path in without_serving.REF_PATHS:
            node: Any = obj
            for key in path:
                node = node.get(key) if isinstance(node, dict) else None
            if isinstance(node, dict) and node.get("apiVersion") == without_serving.SERVING:
                refering.add((obj["kind"], obj["metadata"]["name"]))
    assert refering and refering == patched
    assert ("Broker", "default") in patched and ("PingSource", "sweep-failures") in patched


def test_every_pod_port_is_the_one_the_podmonitors_scrape() -> None:
    # The PodMonitors (knative/monitoring) scrape the port named "user-port", the name Knative
    # Serving gives a Revision's user port; without Serving nothing was scraped and the
    # extender's alert fired for good.
    docs = yaml.safe_load_all((ROOT / "knative" / "monitoring" / "podmonitor.yaml").read_text())
    scraped = {e["port"] for d in docs if d for e in d["spec"]["podMetricsEndpoints"]}
    assert scraped == {"user-port"}
    for obj in generated():
        if obj["kind"] == "Deployment":
            names = {p["name"] for p in obj["spec"]["template"]["spec"]["containers"][0]["ports"]}
            assert names == scraped, obj["metadata"]["name"]
