"""The kubectl plugin's pure parts: reading our records as the functions write them.

Every record here is written by the functions' own writers (``dump_state``, ``NodeHealth``,
``movedoff.mark_value``, the pressure ``Record``), so a change of format that the plugin does
not follow fails here, not on a user's cluster.
"""

from __future__ import annotations

import io
import logging
import re
import tomllib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kubectl_kn_rescheduler import cleanup, cli, explain, nodes, status
from kubectl_kn_rescheduler.reading import (
    UsageError,
    ago,
    installed_settings,
    our_events,
    parse_target,
    section,
)
from shared.api import movedoff
from shared.api.keys import (
    ADMISSION_PARAM_LABEL,
    ADMISSION_PARAM_VALUE,
    FAILING_WORKLOADS_LABEL,
    MAINTENANCE_LABEL,
    MOVED_OFF_LABEL,
    NODE_HEALTH_ANNOTATION,
    PRESSURE_ANNOTATION,
    STATE_ANNOTATION,
    SUSPECT_LABEL,
)
from shared.api.nodehealth import NodeHealth, Seen
from shared.api.pressure import Record
from shared.api.state import PodEntry, Stopped, WorkloadState, dump_state
from shared.api.times import format_time
from shared.platform.config import Config
from shared.platform.kube import Kube
from tests import builders

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
CFG = Config()


def docs_anchors(doc: str) -> set[str]:
    headings = re.findall(r"^#+ (.+)$", (ROOT / doc).read_text(), flags=re.MULTILINE)
    return {section(doc, h).partition("#")[2] for h in headings}


# -- naming things as kubectl does ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("typed", "expected"),
    [
        ("deployment/web", ("Deployment", "web")),
        ("deploy/web", ("Deployment", "web")),
        ("sts/db", ("StatefulSet", "db")),
        ("rs/web-5d8c", ("ReplicaSet", "web-5d8c")),
        ("Job/backup", ("Job", "backup")),
        ("pod/web-0", ("Pod", "web-0")),
    ],
)
def test_a_workload_is_named_as_kubectl_names_it(typed: str, expected: tuple[str, str]) -> None:
    assert parse_target(typed) == expected


@pytest.mark.parametrize("typed", ["web", "daemonset/agents", "deployment/", "cronjob/nightly"])
def test_a_name_without_a_kind_we_move_is_refused_with_what_to_type(typed: str) -> None:
    with pytest.raises(UsageError, match=r"TYPE/NAME|not a kind|names no object"):
        parse_target(typed)


def test_explain_takes_a_bare_pod_name() -> None:
    assert parse_target("web-0", default_kind="pod") == ("Pod", "web-0")


def test_every_rule_the_plugin_names_is_a_section_of_the_docs() -> None:
    anchors = docs_anchors("docs/failure-rules.md")
    for heading in [*explain.HEADINGS, status.STOP]:
        assert section("docs/failure-rules.md", heading).partition("#")[2] in anchors, heading
    opt_in = section(explain.OPT_IN, explain.OPTED_IN_SECTION).partition("#")[2]
    assert opt_in in docs_anchors(explain.OPT_IN)
    assert {"what-it-does", "a-burst-nodes-where-other-workloads-fail-now"} <= docs_anchors(
        "docs/node-health.md"
    )


def test_ages_are_said_as_kubectl_says_them() -> None:
    assert [ago(NOW - timedelta(seconds=s), NOW) for s in (5, 600, 3 * 3600, 3 * 86400, -300)] == [
        "5s ago",
        "10m ago",
        "3h ago",
        "3d ago",
        "in 5m",
    ]
    assert ago(None, NOW) == "at an unknown time"


# -- status -------------------------------------------------------------------------------------


def rs_with(state: WorkloadState | str, **kwargs: Any) -> dict[str, Any]:
    raw = state if isinstance(state, str) else dump_state(state)
    return builders.replicaset(
        "web-5d8c", annotations={STATE_ANNOTATION: raw}, uid="rs-uid", replicas=2, **kwargs
    )


def test_a_replicasets_record_says_its_budget_exclusions_and_why() -> None:
    state = WorkloadState(
        moves=2,
        excluded_nodes=("node-a",),
        failed_on={"node-a": "CrashLoopBackOff"},
        updated_at=NOW - timedelta(minutes=3),
        holder_uid="rs-uid",
    )
    holder = status.holder_status("ReplicaSet", rs_with(state), "current, revision 2")
    said = status.WorkloadStatus(
        "Deployment", "shop", "web", "Deployment web", 3, (holder,), (), ()
    )
    text = "\n".join(status.render(said, NOW))
    assert "moves: 2 of 6 used (3 per replica)" in text
    assert "node-a: failed there with CrashLoopBackOff" in text
    assert "(3m ago)" in text
    assert status.as_json(said)["holders"][0]["budget"] == 6


def test_a_stop_is_said_with_its_nodes_and_its_rule() -> None:
    state = WorkloadState(
        moves=2,
        stopped=Stopped("CrashLoopBackOff", ("node-a", "node-b"), NOW - timedelta(minutes=1)),
        holder_uid="rs-uid",
    )
    holder = status.holder_status("ReplicaSet", rs_with(state), "current")
    text = "\n".join(status._holder_lines(holder, 3, NOW))
    assert "moves stopped 60s ago: it failed with CrashLoopBackOff on node-a, node-b" in text
    assert "#a-workload-that-fails-the-same-way-everywhere-moves-stop" in text


def test_a_record_the_functions_refuse_is_shown_refused_not_read() -> None:
    holder = status.holder_status("ReplicaSet", rs_with('{"version": 9}'), "current")
    assert holder.state is None
    assert "refuse this record" in holder.refused and "version 9" in holder.refused


def test_a_copy_of_another_objects_record_is_shown_ignored() -> None:
    copied = WorkloadState(moves=1, excluded_nodes=("node-a",), holder_uid="another-uid")
    holder = status.holder_status("ReplicaSet", rs_with(copied), "current")
    assert holder.refused.startswith("ignored: it is a copy of the state of another object")


def test_a_statefulsets_budget_is_said_per_pod() -> None:
    state = WorkloadState(
        moves=3,
        per_pod={"db-0": _entry(2, ("node-a",)), "db-1": _entry(1, ())},
        holder_uid="sts-uid",
    )
    sts = builders.statefulset(
        "db", replicas=2, uid="sts-uid", annotations={STATE_ANNOTATION: dump_state(state)}
    )
    text = "\n".join(status._holder_lines(status.holder_status("StatefulSet", sts, "x"), 2, NOW))
    assert "db-0: 2 of 2 moves, kept off node-a" in text
    assert "db-1: 1 of 2 moves" in text


def _entry(moves: int, nodes: tuple[str, ...]) -> PodEntry:
    return PodEntry(moves=moves, excluded_nodes=nodes)


@pytest.mark.parametrize(
    ("policy", "said"),
    [(None, "not opted in"), (0, '"0", moves turned off'), (3, '"3" (on Deployment web)')],
)
def test_the_policy_is_said_as_the_functions_read_it(policy: int | None, said: str) -> None:
    out = status.render(
        status.WorkloadStatus("Deployment", "shop", "web", "Deployment web", policy, (), (), ()),
        NOW,
    )
    assert said in out[1]


def test_only_our_events_are_listed_oldest_first() -> None:
    def event(reason: str, component: str, minutes: int) -> dict[str, Any]:
        return {
            "involvedObject": {"kind": "ReplicaSet", "name": "web-5d8c"},
            "reason": reason,
            "type": "Normal",
            "reportingComponent": component,
            "lastTimestamp": format_time(NOW - timedelta(minutes=minutes)),
            "count": 2,
            "message": "m",
        }

    found = our_events(
        [
            event("Rescheduled", "kn-rescheduler", 1),
            event("SuccessfulCreate", "replicaset-controller", 2),
            event("MovesStopped", "kn-rescheduler", 5),
        ]
    )
    assert [e.reason for e in found] == ["MovesStopped", "Rescheduled"]
    assert found[0].count == 2


# -- nodes --------------------------------------------------------------------------------------


def node(labels: dict[str, str], annotations: dict[str, str], taints: Any = ()) -> Any:
    return {
        "metadata": {
            "name": "node-a",
            "resourceVersion": "4711",
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {"taints": list(taints)},
    }


def test_a_suspect_node_says_since_when_who_failed_and_what_the_next_review_does() -> None:
    since = NOW - timedelta(minutes=4)
    record = NodeHealth(
        failures=(
            Seen(since, "Deployment shop/web", "u1", "CrashLoopBackOff"),
            Seen(since, "Deployment shop/api", "u2", "OOMKilled"),
        ),
        suspect_since=since,
        suspect_workloads=("Deployment shop/api", "Deployment shop/web"),
    )
    marks = nodes.node_marks(
        node(
            {SUSPECT_LABEL: "true"},
            {NODE_HEALTH_ANNOTATION: record.to_json()},
            [{"key": SUSPECT_LABEL, "value": "true", "effect": "PreferNoSchedule"}],
        ),
        NOW,
        CFG,
    )
    text = "\n".join(marks.lines)
    assert f"suspect (label and taint) since {format_time(since)} (4m ago)" in text
    assert "Deployment shop/web CrashLoopBackOff 4m ago" in text
    # The window is 10 minutes: the newest failure counts for 6 more.
    assert "the last one counts until" in text and "(in 6m)" in text
    assert "assess-nodes' next review keeps it suspect" in text
    assert set(marks.keys) >= {SUSPECT_LABEL, NODE_HEALTH_ANNOTATION, f"taint {SUSPECT_LABEL}"}


def test_an_expired_suspicion_is_said_to_be_cleared_at_the_next_review() -> None:
    old = NOW - timedelta(hours=1)
    record = NodeHealth(suspect_since=old, suspect_workloads=("Deployment shop/web",))
    marks = nodes.node_marks(
        node({SUSPECT_LABEL: "true"}, {NODE_HEALTH_ANNOTATION: record.to_json()}), NOW, CFG
    )
    assert any("assess-nodes' next review clears it" in line for line in marks.lines)


def test_a_moved_off_mark_says_until_when_it_steers() -> None:
    at = NOW - timedelta(seconds=30)
    marks = nodes.node_marks(node({MOVED_OFF_LABEL: movedoff.mark_value(at)}, {}), NOW, CFG)
    (line,) = marks.lines
    assert "a pod was moved off it 30s ago" in line
    assert "steers new pods away until" in line and "(in 90s)" in line


def test_a_pressure_label_is_explained_from_label_nodes_record() -> None:
    record = Record(rule="cpu", value=91.5, since=NOW - timedelta(minutes=7))
    marks = nodes.node_marks(
        node({"status": "presure"}, {PRESSURE_ANNOTATION: record.to_json()}), NOW, CFG
    )
    assert marks.lines == (
        f"pressure: rule cpu = 91.5 since {format_time(record.since)} (7m ago), label "  # type: ignore[arg-type]
        "status=presure (label-nodes)",
    )


def test_marks_people_set_are_listed_apart_and_are_not_ours() -> None:
    marks = nodes.node_marks(node({MAINTENANCE_LABEL: "true"}, {}), NOW, CFG)
    assert not marks.marked
    assert marks.people and "set by people" in marks.people[0]


def test_a_node_without_marks_says_nothing() -> None:
    assert nodes.node_marks(node({"example.com/team": "blue"}, {}), NOW, CFG).lines == ()


def test_an_unreadable_health_record_is_said_not_guessed() -> None:
    marks = nodes.node_marks(node({}, {NODE_HEALTH_ANNOTATION: "{not json"}), NOW, CFG)
    assert marks.lines[0].startswith("node-health: unreadable")


# -- the installed settings ------------------------------------------------------------------


class Listing:
    """What the API server answers to the settings' LIST (the only call the reader makes)."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items
        self.asked: list[tuple[str, str | None, str | None]] = []

    def list_all(self, kind: str, namespace: str | None = None, **kw: Any) -> Any:
        self.asked.append((kind, namespace, kw.get("label_selector")))
        return iter(self.items)


def config_map(name: str, created: str, data: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "creationTimestamp": created}, "data": data}


def test_the_newest_settings_configmap_is_the_one_judged_with() -> None:
    listing = Listing(
        [
            config_map("kn-rescheduler-config-aaa", "2026-11-01T00:00:00Z", {}),
            config_map(
                "kn-rescheduler-config-bbb",
                "2026-11-20T00:00:00Z",
                {"KN_RESCHEDULER_SUSPECT_WINDOW": "25m", "OTHER": "x"},
            ),
        ]
    )
    settings = installed_settings(listing, "kn-rescheduler")  # type: ignore[arg-type]
    assert settings.cfg.suspect_window == timedelta(minutes=25)
    assert settings.source == "ConfigMap kn-rescheduler/kn-rescheduler-config-bbb"
    assert listing.asked[0][:2] == ("ConfigMap", "kn-rescheduler")


def test_settings_that_do_not_parse_leave_the_defaults_and_say_so() -> None:
    broken = config_map("c", "2026-11-20T00:00:00Z", {"KN_RESCHEDULER_SUSPECT_WINDOW": "soon"})
    settings = installed_settings(Listing([broken]))  # type: ignore[arg-type]
    assert settings.cfg == Config()
    assert settings.source.startswith("the defaults: ConfigMap kn-rescheduler/c does not parse")


# -- the command line ---------------------------------------------------------------------------


def test_kubectls_flags_are_taken_before_and_after_the_command() -> None:
    before = cli.parser().parse_args(["-n", "shop", "-o", "json", "status", "deploy/web"])
    after = cli.parser().parse_args(["status", "deploy/web", "-n", "shop", "-o", "json"])
    for args in (before, after):
        assert (args.namespace, args.output, args.workload) == ("shop", "json", "deploy/web")


def test_cleanup_only_lists_unless_asked() -> None:
    args = cli.parser().parse_args(["cleanup"])
    assert (args.yes, args.dry_run) == (False, None)


def test_a_kubeconfig_that_is_not_there_is_one_sentence_and_exit_1(tmp_path: Path) -> None:
    err = io.StringIO()
    code = cli.main(["--kubeconfig", str(tmp_path / "none"), "nodes"], io.StringIO(), err)
    assert code == cli.FAILED
    assert err.getvalue().startswith("kubectl-kn_rescheduler: cannot use the kubeconfig: no cred")
    assert len(err.getvalue().strip().splitlines()) == 1


@pytest.mark.parametrize(
    "content",
    [b"clusters: [", b"\xff\xfe\x00binary", b'"a string"', b"- a\n- list\n"],
    ids=["broken YAML", "binary", "a JSON string", "a list"],
)
def test_a_kubeconfig_that_is_not_one_is_one_sentence_and_exit_1(
    tmp_path: Path, content: bytes
) -> None:
    config = tmp_path / "kubeconfig"
    config.write_bytes(content)
    err = io.StringIO()
    code = cli.main(["--kubeconfig", str(config), "nodes"], io.StringIO(), err)
    assert code == cli.FAILED
    assert err.getvalue().startswith("kubectl-kn_rescheduler: cannot use the kubeconfig: ")
    assert len(err.getvalue().strip().splitlines()) == 1


def test_the_package_installs_the_names_kubectl_and_kn_look_for() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    # kubectl maps `kubectl kn-rescheduler` to kubectl-kn_rescheduler; kn maps `kn rescheduler`
    # to kn-rescheduler.
    assert scripts == {
        "kubectl-kn_rescheduler": "kubectl_kn_rescheduler.cli:run",
        "kn-rescheduler": "kubectl_kn_rescheduler.cli:run",
    }


def test_the_namespace_defaults_to_the_contexts_as_kubectl_does(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(
        """apiVersion: v1
kind: Config
current-context: shop
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts:
- {name: shop, context: {cluster: c, user: u, namespace: shop}}
- {name: bare, context: {cluster: c, user: u}}
"""
    )
    assert Kube.context_namespace(str(config)) == "shop"
    assert Kube.context_namespace(str(config), "bare") is None
    assert Kube.context_namespace(str(tmp_path / "none")) is None


def test_what_others_wrote_cannot_drive_the_terminal() -> None:
    # An Event message or a name carrying an escape sequence (clear screen, a fake prompt).
    assert cli.shown("moved\x1b[2J pod\x07 web\x9b") == "moved\\x1b[2J pod\\x07 web\\x9b"
    assert cli.shown("tab\tkept") == "tab\tkept"


def test_invisible_characters_and_endless_lines_are_shown_safe() -> None:
    # A right-to-left override that would show "gpj.exe" as "exe.jpg", a zero-width space.
    assert cli.shown("file\u202egpj.exe\u200b") == "file\\u202egpj.exe\\u200b"
    long = cli.shown("x" * 5000)
    assert len(long) < 2100 and long.endswith("(3000 more characters; -o json has all)")


def test_a_settings_file_named_by_the_configmap_is_not_read_here() -> None:
    planted = config_map("c", "2026-11-20T00:00:00Z", {"KN_RESCHEDULER_CONFIG_FILE": "/etc/passwd"})
    assert installed_settings(Listing([planted])).cfg == Config()  # type: ignore[arg-type]


def test_a_revision_someone_wrote_by_hand_sorts_last_and_crashes_nothing() -> None:
    hand = builders.replicaset("web-1", annotations={status.REVISION: "abc"})
    real = builders.replicaset("web-2", annotations={status.REVISION: "7"})
    assert (status._revision(hand), status._revision(real)) == (-1, 7)


# -- cleanup: only what is ours -----------------------------------------------------------------


def pressured(value: str, record: Record | None) -> Any:
    annotations = {PRESSURE_ANNOTATION: record.to_json()} if record else {}
    return node({"status": value}, annotations)


@pytest.mark.parametrize(
    ("value", "record", "label_removed"),
    [
        pytest.param(
            "presure", Record(rule="cpu", since=NOW), True, id="ours: our value, our record"
        ),
        pytest.param(
            "maintenance",
            Record(rule="cpu", since=NOW),
            False,
            id="someone's value beside our record",
        ),
        pytest.param("presure", Record(rule="cpu"), False, id="a record that never put it there"),
        pytest.param("presure", None, False, id="no record of ours"),
    ],
)
def test_the_pressure_label_goes_only_where_label_nodes_put_it(
    value: str, record: Record | None, label_removed: bool
) -> None:
    plan = cleanup.node_cleanup(pressured(value, record))
    removed = plan.removed if plan else ()
    assert (f"label status={value}" in removed) is label_removed
    # Our record goes either way: it is ours, whatever the label.
    assert (f"annotation {PRESSURE_ANNOTATION}" in removed) is (record is not None)


def test_the_pressure_label_stays_when_which_label_label_nodes_wrote_is_not_known() -> None:
    # After an uninstall the settings are gone: status=presure beside our record may be the
    # original scheduler's, and the record does not name its label.
    plan = cleanup.node_cleanup(pressured("presure", Record(rule="cpu", since=NOW)), None)
    assert plan is not None and plan.removed == (f"annotation {PRESSURE_ANNOTATION}",)


@pytest.mark.parametrize(
    ("kind", "removed"),
    [
        ("ReplicaSet", True),
        ("StatefulSet", True),
        ("Job", True),
        ("Deployment", False),
        ("Pod", False),
    ],
)
def test_the_admission_param_label_goes_only_from_the_kinds_the_policies_label(
    kind: str, removed: bool
) -> None:
    obj = {"metadata": {"name": "web", "namespace": "shop", "resourceVersion": "9"}}
    obj["metadata"]["labels"] = {ADMISSION_PARAM_LABEL: ADMISSION_PARAM_VALUE, "team": "blue"}
    plan = cleanup.workload_cleanup(kind, obj)
    assert (plan is not None) is removed
    if plan is not None:
        assert plan.patch["metadata"]["labels"] == {ADMISSION_PARAM_LABEL: None}


def test_an_object_without_a_resource_version_gets_no_unconditional_patch() -> None:
    marked = node(
        {SUSPECT_LABEL: "true"}, {}, [{"key": SUSPECT_LABEL, "effect": "PreferNoSchedule"}]
    )
    del marked["metadata"]["resourceVersion"]
    assert cleanup.node_cleanup(marked) is None
    rs = builders.replicaset("web", annotations={STATE_ANNOTATION: "{}"})
    rs["metadata"].pop("resourceVersion", None)
    assert cleanup.workload_cleanup("ReplicaSet", rs) is None


def test_a_bare_pods_state_is_ours_to_remove() -> None:
    pod = builders.bare_pod("solo-1-ab12c")
    pod["metadata"]["annotations"] = {STATE_ANNOTATION: "{}", "team": "blue"}
    pod["metadata"]["resourceVersion"] = "12"
    plan = cleanup.workload_cleanup("Pod", pod)
    assert plan is not None and plan.removed == (f"annotation {STATE_ANNOTATION}",)
    assert "Pod" in cleanup.WORKLOAD_KINDS


def test_a_failing_workloads_label_the_window_left_behind_is_said_to_go() -> None:
    old = NOW - timedelta(hours=1)
    record = NodeHealth(failures=(Seen(old, "Deployment shop/web", "u1", "CrashLoopBackOff"),))
    marks = nodes.node_marks(
        node({FAILING_WORKLOADS_LABEL: "1"}, {NODE_HEALTH_ANNOTATION: record.to_json()}), NOW, CFG
    )
    assert marks.lines[-1] == f"  and removes its {FAILING_WORKLOADS_LABEL}=1 label"


def test_running_the_command_line_leaves_the_callers_logging_as_it_was(tmp_path: Path) -> None:
    # main() is also called in-process (tests, a notebook): only the executables quiet the log.
    root = logging.getLogger()
    before = root.level
    cli.main(["--kubeconfig", str(tmp_path / "none"), "nodes"], io.StringIO(), io.StringIO())
    assert root.level == before
