"""The pure parts of the local Metrics API (localcluster.metricsserver): kwok's configuration,
the usage the Metrics API should report for a Node, and the node network's forwarding.

kwok evaluates the CEL expressions and metrics-server computes the rates; the end-to-end test
(tests/e2e/test_metrics_server.py) checks those against the real processes. These tests pin
the contract the two sides share: the series names and path metrics-server reads, the labels
that select the load pod, and the reading of an annotation value.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from dev.localcluster import metricsserver as ms
from dev.localcluster.keys import (
    SIM_CPU_USAGE_ANNOTATION,
    SIM_MEMORY_USAGE_ANNOTATION,
)
from dev.localcluster.nodeexporter import usage_fraction as exporter_fraction

# A Node as the local cluster registers it (localcluster.cluster._register_node) and kwok keeps
# it.
NODE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {
        "name": "node-0",
        "labels": {"kubernetes.io/hostname": "node-0", "type": "kwok"},
        "annotations": {
            "kwok.x-k8s.io/node": "fake",
            "node.alpha.kubernetes.io/ttl": "0",
        },
    },
    "status": {
        "capacity": {"cpu": "8", "memory": "32873196Ki", "pods": "110"},
        "allocatable": {"cpu": "7800m", "memory": "32158316Ki", "pods": "110"},
        "addresses": [
            {"type": "InternalIP", "address": "10.0.0.10"},
            {"type": "Hostname", "address": "node-0"},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
    },
}
ALLOCATABLE_CORES = 7.8
ALLOCATABLE_BYTES = 32158316 * 1024


def node_with(**annotations: str) -> dict[str, Any]:
    node: dict[str, Any] = yaml.safe_load(yaml.safe_dump(NODE))
    node["metadata"]["annotations"].update(annotations)
    return node


def test_kwok_serves_the_three_node_series_metrics_server_reads_at_the_per_node_path() -> None:
    metric, usage = yaml.safe_load_all(ms.kwok_config_yaml())

    assert metric["kind"] == "Metric"
    assert metric["spec"]["path"] == "/metrics/nodes/{nodeName}/metrics/resource"
    series = {m["name"]: (m["kind"], m["dimension"], m["value"]) for m in metric["spec"]["metrics"]}
    assert series == {
        "scrape_error": ("gauge", "node", "0"),
        # metrics-server computes CPU as the rate of this counter; kwok integrates it.
        "node_cpu_usage_seconds_total": ("counter", "node", 'node.CumulativeUsage("cpu")'),
        "node_memory_working_set_bytes": ("gauge", "node", 'node.Usage("memory")'),
    }
    assert usage["kind"] == "ClusterResourceUsage"
    # No selector: a pod without a usage would make kwok log an error at every scrape.
    assert "selector" not in usage["spec"]
    assert usage["spec"]["usages"] == [
        {
            "usage": {
                "cpu": {"expression": ms.usage_expression("cpu")},
                "memory": {"expression": ms.usage_expression("memory")},
            }
        }
    ]


def test_the_node_annotation_names_the_path_kwok_serves_for_that_node() -> None:
    assert ms.resource_metrics_path("node-3") == "/metrics/nodes/node-3/metrics/resource"


def test_the_usage_expressions_read_the_simulation_annotations_for_the_load_pod_only() -> None:
    cpu, memory = ms.usage_expression("cpu"), ms.usage_expression("memory")

    assert f'node.metadata.annotations["{SIM_CPU_USAGE_ANNOTATION}"]' in cpu
    assert 'node.status.allocatable["cpu"]' in cpu
    assert f'node.metadata.annotations["{SIM_MEMORY_USAGE_ANNOTATION}"]' in memory
    assert 'node.status.allocatable["memory"]' in memory
    for expression in (cpu, memory):
        assert expression.endswith(': Quantity("0")')  # every other pod uses nothing


def test_the_daemonset_pods_carry_the_namespace_and_label_the_expressions_select() -> None:
    daemonset = next(obj for _, obj in ms.manifests(4443, b"CA") if obj["kind"] == "DaemonSet")
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    condition = (
        f'pod.metadata.namespace == "{daemonset["metadata"]["namespace"]}"'
        f' && "{ms.NAME_LABEL}" in pod.metadata.labels'
        f' && pod.metadata.labels["{ms.NAME_LABEL}"] == "{labels[ms.NAME_LABEL]}"'
    )

    assert ms.usage_expression("cpu").startswith(condition + " ? ")
    assert daemonset["spec"]["selector"]["matchLabels"] == labels
    # On every node, tainted ones too, as a node's own daemons.
    assert daemonset["spec"]["template"]["spec"]["tolerations"] == [{"operator": "Exists"}]


def test_the_apiservice_reaches_metrics_server_through_an_external_name_service() -> None:
    objects = {obj["kind"]: (path, obj) for path, obj in ms.manifests(4443, b"-----CA-----\n")}
    _, service = objects["Service"]
    path, apiservice = objects["APIService"]

    assert path == "/apis/apiregistration.k8s.io/v1/apiservices"
    assert apiservice["metadata"]["name"] == "v1beta1.metrics.k8s.io"
    assert apiservice["spec"]["service"] == {
        "name": service["metadata"]["name"],
        "namespace": service["metadata"]["namespace"],
        "port": 4443,
    }
    assert apiservice["spec"]["caBundle"] == "LS0tLS1DQS0tLS0tCg=="
    assert "insecureSkipTLSVerify" not in apiservice["spec"]
    assert service["spec"]["type"] == "ExternalName"
    assert service["spec"]["externalName"] == "127.0.0.1"


def test_metrics_server_runs_with_the_rbac_of_its_own_manifests() -> None:
    objects = ms.manifests(4443, b"CA")
    bound = {
        obj["roleRef"]["name"]: obj["subjects"]
        for _, obj in objects
        if obj["kind"] in ("RoleBinding", "ClusterRoleBinding")
    }
    service_account = [
        {"kind": "ServiceAccount", "name": "metrics-server", "namespace": "kube-system"}
    ]

    assert bound == {
        "extension-apiserver-authentication-reader": service_account,
        "system:auth-delegator": service_account,
        "system:metrics-server": service_account,
    }


@pytest.mark.parametrize(
    ("raw", "fraction"),
    [
        ("0.9", 0.9),  # what Cluster.set_node_usage writes
        ("1.0", 1.0),
        ("0.0", 0.0),
        ("0.25", 0.25),  # what a person types with kubectl annotate
        (".5", 0.5),
        ("1", 1.0),
        ("1e-1", 0.1),
        ("1.5", 1.0),  # clamped, as the node-exporter endpoints clamp it
        ("-0.2", 0.0),
    ],
)
def test_a_numeric_annotation_is_a_fraction_clamped_to_0_1_as_for_the_node_exporter(
    raw: str, fraction: float
) -> None:
    assert ms.usage_fraction(raw, 0.1) == pytest.approx(fraction)
    assert exporter_fraction(raw, 0.1)[0] == pytest.approx(fraction)


@pytest.mark.parametrize("raw", [None, "", "busy", "90%", "nan", "inf", "0.9 ", "1e999"])
def test_an_absent_or_unreadable_annotation_means_the_quiet_default(raw: str | None) -> None:
    assert ms.usage_fraction(raw, 0.1) == 0.1


def test_the_metrics_api_should_report_the_fractions_of_the_nodes_allocatable() -> None:
    busy = node_with(**{SIM_CPU_USAGE_ANNOTATION: "0.9", SIM_MEMORY_USAGE_ANNOTATION: "0.5"})

    expected = ms.expected_usage(busy)

    assert expected.cpu_cores == pytest.approx(0.9 * ALLOCATABLE_CORES)
    assert expected.memory_bytes == pytest.approx(0.5 * ALLOCATABLE_BYTES)


def test_a_node_nobody_set_a_usage_on_reports_the_node_exporters_quiet_defaults() -> None:
    expected = ms.expected_usage(NODE)

    assert expected.cpu_cores == pytest.approx(0.1 * ALLOCATABLE_CORES)
    assert expected.memory_bytes == pytest.approx(0.2 * ALLOCATABLE_BYTES)


def test_a_node_metrics_item_reads_as_cores_and_bytes() -> None:
    # One item of GET /apis/metrics.k8s.io/v1beta1/nodes from the local metrics-server.
    item = {
        "metadata": {"name": "node-0", "creationTimestamp": "2026-11-23T18:20:07Z"},
        "timestamp": "2026-11-23T18:20:01Z",
        "window": "10.003s",
        "usage": {"cpu": "7019846123n", "memory": "28942484Ki"},
    }

    usage = ms.reported_usage(item)

    assert usage.cpu_cores == pytest.approx(7.019846123)
    assert usage.memory_bytes == 28942484 * 1024
    assert ms.within(
        usage,
        ms.expected_usage(
            node_with(**{SIM_CPU_USAGE_ANNOTATION: "0.9", SIM_MEMORY_USAGE_ANNOTATION: "0.9"})
        ),
    )
    assert not ms.within(usage, ms.expected_usage(NODE))


NODES_BY_IP = {"10.0.0.10": "node-0", "10.0.0.11": "node-1"}


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        # What metrics-server asks a kubelet for, at the Node's InternalIP and status port.
        (
            "http://10.0.0.11:10250/metrics/resource",
            ms.Forward("/metrics/nodes/node-1/metrics/resource"),
        ),
        (
            "http://10.0.0.10:10250/metrics/resource?x=1",
            ms.Forward("/metrics/nodes/node-0/metrics/resource?x=1"),
        ),
        # kwok's own paths pass through (a Node annotated as kwok's docs suggest).
        (
            "http://10.0.0.10:10250/metrics/nodes/node-0/metrics/resource",
            ms.Forward("/metrics/nodes/node-0/metrics/resource"),
        ),
        (
            "http://10.0.0.99:10250/metrics/resource",
            ms.Forward(None, 502, "no Node has the InternalIP 10.0.0.99"),
        ),
        (
            "/metrics/resource",  # not a proxy request
            ms.Forward(None, 400, "a proxy request needs an absolute http:// URL"),
        ),
        (
            "https://10.0.0.10:10250/metrics/resource",  # would need CONNECT
            ms.Forward(None, 400, "a proxy request needs an absolute http:// URL"),
        ),
    ],
)
def test_the_node_network_sends_a_kubelet_request_to_kwoks_path_of_that_node(
    target: str, expected: ms.Forward
) -> None:
    assert ms.forward(target, NODES_BY_IP.get) == expected


def test_the_node_network_learns_the_internal_ips_from_the_node_list() -> None:
    other = node_with()
    other["metadata"]["name"] = "node-1"
    other["status"]["addresses"] = [
        {"type": "Hostname", "address": "node-1"},
        {"type": "InternalIP", "address": "10.0.0.11"},
        {"type": "ExternalIP", "address": "203.0.113.7"},
    ]
    unregistered = {"metadata": {"name": "node-2"}, "status": {}}

    assert ms.nodes_by_internal_ip([NODE, other, unregistered]) == NODES_BY_IP


def test_a_series_value_is_read_from_kwoks_exposition() -> None:
    text = (
        "# HELP node_cpu_usage_seconds_total [ALPHA] Cumulative cpu time consumed by the node"
        " in core-seconds\n"
        "# TYPE node_cpu_usage_seconds_total counter\n"
        "node_cpu_usage_seconds_total 78.03\n"
        "# HELP node_memory_working_set_bytes [ALPHA] Current working set of the node in bytes\n"
        "# TYPE node_memory_working_set_bytes gauge\n"
        "node_memory_working_set_bytes 6.586022707e+09\n"
    )

    assert ms.sample(text, "node_memory_working_set_bytes") == 6.586022707e09
    assert ms.sample(text, "node_cpu_usage_seconds_total") == 78.03
    assert ms.sample(text, "scrape_error") is None
