"""mutate-admission through functions-framework: it answers allowed, whatever happens."""

from __future__ import annotations

import base64
import http.server
import json
import threading
import urllib.parse
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import jsonpatch
import pytest

from shared.api import movedoff
from shared.api.keys import (
    EXCLUDED_NODES_ANNOTATION,
    FAILING_WORKLOADS_LABEL,
    MOVED_OFF_LABEL,
    OPT_OUT_LABEL,
    OPTED_IN_LABEL,
    POLICY_STAMP_ANNOTATION,
    STATE_ANNOTATION,
)
from shared.platform.config import Config
from tests.handlers.conftest import ClientFactory
from tests.unit import pods
from tests.unit.apivalidation import api_server_errors


def patch_of(answer: dict[str, Any]) -> list[dict[str, Any]]:
    assert answer.get("patchType") == "JSONPatch"
    return cast(list[dict[str, Any]], json.loads(base64.b64decode(answer["patch"])))


def review(operation: str = "CREATE", kind: str = "Pod", obj: object = None) -> dict[str, object]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": operation,
            "namespace": "shop",
            "object": obj if obj is not None else pods.pod(node=None, stamp=None),
        },
    }


def test_the_pod_is_allowed_unpatched_when_the_api_server_cannot_be_reached(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client("mutate-admission", KUBECONFIG=str(unreachable_kubeconfig))
    response = client.post("/", json=review())
    assert response.status_code == 200
    answer = response.get_json()
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["response"] == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


# What every pod whose policy allows moves gets by default: the scheduler prefers nodes not
# labelled status=presure (weight 20, as the seed's). Suspect nodes are kept off by their taint;
# a preference away from them is off by default (docs/node-health.md).
SOFT_AFFINITY = {
    "preferredDuringSchedulingIgnoredDuringExecution": [
        {
            "weight": 20,
            "preference": {
                "matchExpressions": [{"key": "status", "operator": "NotIn", "values": ["presure"]}]
            },
        },
    ]
}


def test_a_bare_pod_with_a_policy_is_stamped_without_any_lookup(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client("mutate-admission", KUBECONFIG=str(unreachable_kubeconfig))
    bare = pods.pod(owner=None, node=None, stamp=None, annotations={"scheduling-retries": "2"})
    answer = client.post("/", json=review(obj=bare)).get_json()["response"]
    assert answer["allowed"] is True
    # The user's own annotation is the policy; the stamp is ours, next to it, and the label
    # the ApiServerSource selects on. No exclusions yet; the soft affinities away from suspect
    # nodes and nodes under pressure (labels, so no lookup either).
    assert sorted(patch_of(answer), key=lambda op: str(op["path"])) == [
        {
            "op": "add",
            "path": "/metadata/annotations/kn-rescheduler.io~1scheduling-retries",
            "value": "2",
        },
        {"op": "add", "path": "/metadata/labels/kn-rescheduler.io~1opted-in", "value": "true"},
        {"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": SOFT_AFFINITY}},
    ]


def test_invalid_node_names_in_a_bare_pods_state_are_skipped_and_the_pod_stays_valid(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    # A tenant's own bare pod, with a hand-written state: the API server would refuse a pod
    # avoiding "Bad_Name!", and failurePolicy Ignore would not save it.
    client = function_client("mutate-admission", KUBECONFIG=str(unreachable_kubeconfig))
    state = '{"version":2,"moves":1,"excludedNodes":["Bad_Name!","node-1"]}'
    bare = pods.pod(
        owner=None,
        node=None,
        stamp=None,
        annotations={"scheduling-retries": "2", STATE_ANNOTATION: state},
    )
    answer = client.post("/", json=review(obj=bare)).get_json()["response"]
    assert answer["allowed"] is True
    created = jsonpatch.apply_patch(bare, patch_of(answer))
    assert created["spec"]["affinity"]["nodeAffinity"] == {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchFields": [
                        {"key": "metadata.name", "operator": "NotIn", "values": ["node-1"]}
                    ]
                }
            ]
        },
        **SOFT_AFFINITY,
    }
    assert created["metadata"]["annotations"][EXCLUDED_NODES_ANNOTATION] == '["node-1"]'
    assert api_server_errors(created) == []


def test_a_policy_of_zero_stamps_the_pod_but_injects_no_exclusions(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client("mutate-admission", KUBECONFIG=str(unreachable_kubeconfig))
    state = '{"version":2,"moves":2,"excludedNodes":["node-a","node-b"]}'
    bare = pods.pod(
        owner=None,
        node=None,
        stamp=None,
        excluded=["node-a"],
        annotations={"scheduling-retries": "0", STATE_ANNOTATION: state},
    )
    answer = client.post("/", json=review(obj=bare)).get_json()["response"]
    created = jsonpatch.apply_patch(bare, patch_of(answer))
    assert "affinity" not in created["spec"]
    assert created["metadata"]["annotations"][POLICY_STAMP_ANNOTATION] == "0"
    assert created["metadata"]["labels"][OPTED_IN_LABEL] == "true"
    assert EXCLUDED_NODES_ANNOTATION not in created["metadata"]["annotations"]


def test_a_bare_pods_replacement_keeps_the_exclusions_of_the_state_it_carries(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    # update-annotations created this replacement with the old pod's state, which names the
    # old pod's uid: for a bare pod that is its own state, not a copy to ignore.
    client = function_client("mutate-admission", KUBECONFIG=str(unreachable_kubeconfig))
    state = json.dumps(
        {"version": 2, "moves": 1, "excludedNodes": ["node-b"], "holderUid": pods.uid("solo")}
    )
    replacement = pods.pod(
        "solo-3f9c2",
        owner=None,
        node=None,
        stamp=None,
        annotations={"scheduling-retries": "2", STATE_ANNOTATION: state},
    )
    answer = client.post("/", json=review(obj=replacement)).get_json()["response"]
    created = jsonpatch.apply_patch(replacement, patch_of(answer))
    assert created["metadata"]["annotations"][EXCLUDED_NODES_ANNOTATION] == '["node-b"]'
    terms = created["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-b"]}]}
    ]


def test_a_bare_pod_carrying_only_our_stamp_loses_it(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    # e.g. an orphaned pod's manifest applied again: our stamp is not the user's policy, and
    # without the label the pod's events stay out of the pipeline.
    client = function_client("mutate-admission", KUBECONFIG=str(unreachable_kubeconfig))
    copied = pods.pod(
        owner=None,
        node=None,
        stamp="3",
        excluded=["node-a"],
        labels={"app": "web", OPTED_IN_LABEL: "true"},
    )
    answer = client.post("/", json=review(obj=copied)).get_json()["response"]
    created = jsonpatch.apply_patch(copied, patch_of(answer))
    assert POLICY_STAMP_ANNOTATION not in created["metadata"].get("annotations", {})
    assert EXCLUDED_NODES_ANNOTATION not in created["metadata"].get("annotations", {})
    assert created["metadata"]["labels"] == {"app": "web"}


def test_an_opted_out_pod_is_admitted_without_a_patch(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    # The webhook's objectSelector keeps such pods away in a cluster; a review that arrives
    # anyway (another registration, a hand-made call) changes nothing either: no stamp, no label.
    client = function_client("mutate-admission", KUBECONFIG=str(unreachable_kubeconfig))
    bare = pods.pod(
        owner=None,
        node=None,
        stamp=None,
        annotations={"scheduling-retries": "2"},
        labels={"app": "web", OPT_OUT_LABEL: "true"},
    )
    answer = client.post("/", json=review(obj=bare)).get_json()["response"]
    assert answer == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


def test_other_operations_and_kinds_are_allowed_untouched(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client("mutate-admission", KUBECONFIG=str(unreachable_kubeconfig))
    for body in (review(operation="UPDATE"), review(kind="Service", obj={"metadata": {}})):
        answer = client.post("/", json=body).get_json()["response"]
        assert answer == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


def test_a_body_without_a_request_uid_gets_400(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client("mutate-admission", KUBECONFIG=str(unreachable_kubeconfig))
    assert client.post("/", data=b"not json").status_code == 400
    assert client.post("/", data=json.dumps({"request": {}})).status_code == 400


# -- a replacement in a burst: the preference away from failing and moved-off nodes ------------


class _NodesApi(http.server.BaseHTTPRequestHandler):
    """An API server with the cluster's Nodes (the server's ``nodes``: name -> labels): a Node
    LIST filtered by label selector (one key: existence) and field selector
    (``metadata.name!=``) as kube-apiserver filters it, the shop Namespace without labels, 404
    for anything else."""

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        self.server.requests.append((url.path, query))  # type: ignore[attr-defined]
        status, body = 404, {"kind": "Status", "reason": "NotFound", "code": 404}
        if url.path == "/api/v1/nodes":
            key = query.get("labelSelector", "")
            unwanted = {f.split("!=", 1)[1] for f in query.get("fieldSelector", "").split(",") if f}
            nodes = self.server.nodes  # type: ignore[attr-defined]
            items = [
                {"metadata": {"name": name, "labels": labels}}
                for name, labels in nodes.items()
                if (not key or key in labels) and name not in unwanted
            ]
            limit = int(query.get("limit", "500"))
            status, body = 200, {"kind": "NodeList", "metadata": {}, "items": items[:limit]}
        elif url.path == "/api/v1/namespaces/shop":
            status, body = 200, {"kind": "Namespace", "metadata": {"name": "shop"}}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def nodes_api(tmp_path: Path) -> Iterator[tuple[Path, dict[str, dict[str, str]], list[Any]]]:
    """A kubeconfig for a `_NodesApi` on loopback, its Nodes (fill them in) and the requests
    it answered."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NodesApi)
    nodes: dict[str, dict[str, str]] = {}
    requests: list[Any] = []
    server.nodes = nodes  # type: ignore[attr-defined]
    server.requests = requests  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = tmp_path / "nodes-kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{server.server_port}'}}}}]\n"
        "users: [{name: u, user: {}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
        "current-context: c\n"
    )
    try:
        yield kubeconfig, nodes, requests
    finally:
        server.shutdown()
        server.server_close()


OWN_PREFERENCE = {
    "weight": 5,
    "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
}
NOT_FAILING = {"key": FAILING_WORKLOADS_LABEL, "operator": "DoesNotExist"}


def replacement_carrying(*preferred: dict[str, Any]) -> Any:
    """A bare pod's replacement as update-annotations creates it: the failed pod's spec, its
    preferred terms included, and the state naming the node it was moved off (node-b)."""
    state = json.dumps(
        {"version": 2, "moves": 1, "excludedNodes": ["node-b"], "holderUid": pods.uid("solo")}
    )
    return pods.pod(
        "solo-3f9c2",
        owner=None,
        node=None,
        stamp=None,
        annotations={"scheduling-retries": "2", STATE_ANNOTATION: state},
        affinity={
            "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": list(preferred)}
        },
    )


def test_a_replacement_in_a_burst_prefers_nodes_not_freshly_moved_off_in_place_of_older_terms(
    function_client: ClientFactory,
    nodes_api: tuple[Path, dict[str, dict[str, str]], list[Any]],
) -> None:
    kubeconfig, nodes, requests = nodes_api
    # update-annotations marked node-b (this pod's) and node-c seconds ago; assess-nodes has
    # labelled neither yet. node-d is healthy.
    marked = movedoff.mark_value(datetime.now(UTC) - timedelta(seconds=5))
    nodes.update(
        {"node-b": {MOVED_OFF_LABEL: marked}, "node-c": {MOVED_OFF_LABEL: marked}, "node-d": {}}
    )
    # The failed pod was itself a replacement: our term of then, before the user's last one.
    earlier = {"weight": 100, "preference": {"matchExpressions": [NOT_FAILING]}}
    pressure = SOFT_AFFINITY["preferredDuringSchedulingIgnoredDuringExecution"][0]
    replacement = replacement_carrying(pressure, earlier, OWN_PREFERENCE)
    client = function_client("mutate-admission", KUBECONFIG=str(kubeconfig))
    window = Config().moved_off_window
    first = movedoff.steers_before(datetime.now(UTC), window)
    answer = client.post("/", json=review(obj=replacement)).get_json()["response"]
    last = movedoff.steers_before(datetime.now(UTC), window)
    assert answer["allowed"] is True
    created = jsonpatch.apply_patch(replacement, patch_of(answer))
    preferred = created["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    # The user's terms as they were, ours replaced by the two of now (never accumulated).
    assert preferred[:2] == [pressure, OWN_PREFERENCE]
    assert preferred[2] == {
        "weight": 100,
        "preference": {
            "matchExpressions": [NOT_FAILING, {"key": MOVED_OFF_LABEL, "operator": "DoesNotExist"}]
        },
    }
    (operand,) = preferred[3]["preference"]["matchExpressions"][1]["values"]
    assert first <= operand <= last  # the admission's own time (same number of digits)
    assert preferred[3] == {
        "weight": 100,
        "preference": {
            "matchExpressions": [
                NOT_FAILING,
                {"key": MOVED_OFF_LABEL, "operator": "Lt", "values": [operand]},
            ]
        },
    }
    assert len(preferred) == 4
    assert api_server_errors(created) == []
    # The failing-workloads LIST found nothing, so the marks were listed, node-b left out.
    lists = [query for path, query in requests if path == "/api/v1/nodes"]
    assert lists == [
        {
            "limit": "1",
            "labelSelector": FAILING_WORKLOADS_LABEL,
            "fieldSelector": "metadata.name!=node-b",
        },
        {
            "limit": "50",
            "labelSelector": MOVED_OFF_LABEL,
            "fieldSelector": "metadata.name!=node-b",
        },
    ]


def test_a_replacement_whose_only_marks_are_its_own_or_stale_gets_no_such_preference(
    function_client: ClientFactory,
    nodes_api: tuple[Path, dict[str, dict[str, str]], list[Any]],
) -> None:
    kubeconfig, nodes, _ = nodes_api
    now = datetime.now(UTC)
    nodes.update(
        {
            "node-b": {MOVED_OFF_LABEL: movedoff.mark_value(now)},
            "node-c": {MOVED_OFF_LABEL: movedoff.mark_value(now - timedelta(minutes=30))},
        }
    )
    old = movedoff.steers_before(now - timedelta(minutes=30), Config().moved_off_window)
    ours = {
        "weight": 100,
        "preference": {
            "matchExpressions": [
                NOT_FAILING,
                {"key": MOVED_OFF_LABEL, "operator": "Lt", "values": [old]},
            ]
        },
    }
    replacement = replacement_carrying(OWN_PREFERENCE, ours)
    client = function_client("mutate-admission", KUBECONFIG=str(kubeconfig))
    answer = client.post("/", json=review(obj=replacement)).get_json()["response"]
    created = jsonpatch.apply_patch(replacement, patch_of(answer))
    assert created["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ] == [OWN_PREFERENCE, *SOFT_AFFINITY["preferredDuringSchedulingIgnoredDuringExecution"]]


def test_a_replacement_is_admitted_with_its_exclusions_when_no_node_can_be_listed(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    earlier = {"weight": 100, "preference": {"matchExpressions": [NOT_FAILING]}}
    replacement = replacement_carrying(OWN_PREFERENCE, earlier)
    client = function_client("mutate-admission", KUBECONFIG=str(unreachable_kubeconfig))
    answer = client.post("/", json=review(obj=replacement)).get_json()["response"]
    assert answer["allowed"] is True
    created = jsonpatch.apply_patch(replacement, patch_of(answer))
    assert created["spec"]["affinity"]["nodeAffinity"] == {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchFields": [
                        {"key": "metadata.name", "operator": "NotIn", "values": ["node-b"]}
                    ]
                }
            ]
        },
        "preferredDuringSchedulingIgnoredDuringExecution": [
            OWN_PREFERENCE,
            *SOFT_AFFINITY["preferredDuringSchedulingIgnoredDuringExecution"],
        ],
    }
