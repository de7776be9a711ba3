"""What a move costs a Job, and the webhook's "ignore disruptions" rule (shared.workloads.jobs).

Jobs are shaped as a 1.36 API server returns them (defaulted: backoffLimit, completionMode,
podReplacementPolicy, the controller-uid selector), pods as a kubelet writes them. What the
Job controller does with a removed pod is pkg/controller/job (isPodFailed,
matchPodFailurePolicy, pastBackoffLimitOnFailure); these tables pin our reading of it.
"""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any, cast

import jsonpatch
import pytest

from shared.api.keys import JOB_INDEX_FAILURE_COUNT_ANNOTATION, JOB_TRACKING_FINALIZER
from shared.api.kubetypes import Job, Pod
from shared.workloads.jobs import (
    JobFacts,
    Outcome,
    Verdict,
    ignore_disruptions,
    judge_removal,
    move_cost,
    pending_failures,
)
from tests.unit.pods import crash_looping, pending_on_node, pod, running, terminated, uid, waiting

JOB_UID = "5b0e1a47-3f0d-4a49-9d9b-8f2c6a1e7c01"
IGNORE_DISRUPTIONS = {
    "action": "Ignore",
    "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
}


def job(
    *,
    restart: str = "Never",
    backoff_limit: int = 6,
    rules: list[dict[str, Any]] | None = None,
    failed: int = 0,
    uncounted: list[str] | None = None,
    per_index: int | None = None,
    managed_by: str | None = None,
    annotations: dict[str, str] | None = None,
) -> Job:
    spec: dict[str, Any] = {
        "parallelism": 2,
        "completions": 2,
        "backoffLimit": backoff_limit,
        "completionMode": "Indexed" if per_index is not None else "NonIndexed",
        "suspend": False,
        "manualSelector": False,
        "podReplacementPolicy": "Failed" if rules is not None else "TerminatingOrFailed",
        "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": JOB_UID}},
        "template": {
            "metadata": {
                "labels": {
                    "batch.kubernetes.io/controller-uid": JOB_UID,
                    "batch.kubernetes.io/job-name": "report",
                    "controller-uid": JOB_UID,
                    "job-name": "report",
                }
            },
            "spec": {
                "containers": [{"name": "app", "image": "registry.example/report:1.4"}],
                "restartPolicy": restart,
                "terminationGracePeriodSeconds": 30,
                "dnsPolicy": "ClusterFirst",
                "schedulerName": "default-scheduler",
            },
        },
    }
    if rules is not None:
        spec["podFailurePolicy"] = {"rules": rules}
    if per_index is not None:
        spec["backoffLimitPerIndex"] = per_index
    if managed_by is not None:
        spec["managedBy"] = managed_by
    status: dict[str, Any] = {"active": 2, "ready": 0, "terminating": 0}
    if failed:
        status["failed"] = failed
    status["uncountedTerminatedPods"] = {"failed": uncounted} if uncounted else {}
    meta: dict[str, Any] = {
        "name": "report",
        "namespace": "shop",
        "uid": JOB_UID,
        "resourceVersion": "4711",
        "generation": 1,
        "labels": {"batch.kubernetes.io/controller-uid": JOB_UID, "job-name": "report"},
        "annotations": {"scheduling-retries": "3", **(annotations or {})},
    }
    return cast(
        Job,
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec, "status": status},
    )


def job_pod(p: Pod, *, name: str = "report-x7k2p", finalizer: bool = True, **meta: Any) -> Pod:
    """A pod as the Job controller creates it: owned by the Job, its tracking finalizer on."""
    shaped = copy.deepcopy(p)
    m = shaped.setdefault("metadata", {})
    m["name"] = name
    m["uid"] = uid(name)
    m["ownerReferences"] = [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": "report",
            "uid": JOB_UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    m["labels"] = {"batch.kubernetes.io/controller-uid": JOB_UID, "job-name": "report"}
    if finalizer:
        m["finalizers"] = [JOB_TRACKING_FINALIZER]
    else:
        # The controller removes it once it has counted the pod.
        m.pop("finalizers", None)
    m.update(meta)  # type: ignore[typeddict-item]
    return shaped


PULL_FAILING = job_pod(
    pending_on_node(
        timedelta(minutes=2),
        containers=[
            waiting("ImagePullBackOff", 'Back-off pulling image "registry.example/report:1.4"')
        ],
        owner=("Job", "report"),
    )
)
CRASH_LOOPING = job_pod(pod(containers=[crash_looping(restarts=3)], owner=("Job", "report")))
RUNNING = job_pod(pod(containers=[running()], owner=("Job", "report")))
LAST_EXIT_42 = job_pod(
    pod(containers=[crash_looping(restarts=3, exit_code=42)], owner=("Job", "report"))
)


@pytest.mark.parametrize(
    ("what", "rules", "the_pod", "evicting", "outcome"),
    [
        (
            "a Job without a pod failure policy counts every removed pod",
            None,
            PULL_FAILING,
            True,
            Outcome.COUNTED,
        ),
        (
            "an Ignore rule on DisruptionTarget ignores an evicted pod",
            [IGNORE_DISRUPTIONS],
            PULL_FAILING,
            True,
            Outcome.IGNORED,
        ),
        (
            "a plain delete sets no DisruptionTarget, so the Ignore rule does not match",
            [IGNORE_DISRUPTIONS],
            PULL_FAILING,
            False,
            Outcome.COUNTED,
        ),
        (
            "a FailJob rule on exit code 42 before the Ignore rule fails the Job whose pod last "
            "exited 42",
            [
                {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}},
                IGNORE_DISRUPTIONS,
            ],
            LAST_EXIT_42,
            True,
            Outcome.FAILS_JOB,
        ),
        (
            "that FailJob rule does not match a pod that never ran: the Ignore rule decides",
            [
                {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}},
                IGNORE_DISRUPTIONS,
            ],
            PULL_FAILING,
            True,
            Outcome.IGNORED,
        ),
        (
            "a FailJob rule on any non-zero exit may match a running container killed on its "
            "way out: read as failing the Job",
            [
                {"action": "FailJob", "onExitCodes": {"operator": "NotIn", "values": [0]}},
                IGNORE_DISRUPTIONS,
            ],
            RUNNING,
            True,
            Outcome.FAILS_JOB,
        ),
        (
            "an Ignore on exit codes that a killed container may not reach is no promise",
            [{"action": "Ignore", "onExitCodes": {"operator": "In", "values": [137, 143]}}],
            RUNNING,
            True,
            Outcome.COUNTED,
        ),
        (
            "a Count rule on DisruptionTarget counts the evicted pod",
            [
                {
                    "action": "Count",
                    "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                }
            ],
            PULL_FAILING,
            True,
            Outcome.COUNTED,
        ),
        (
            "rules for other conditions do not match",
            [{"action": "Ignore", "onPodConditions": [{"type": "ConfigIssue", "status": "True"}]}],
            PULL_FAILING,
            True,
            Outcome.COUNTED,
        ),
        (
            "a FailIndex rule on DisruptionTarget fails the index",
            [
                {
                    "action": "FailIndex",
                    "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                }
            ],
            PULL_FAILING,
            True,
            Outcome.FAILS_INDEX,
        ),
    ],
)
def test_the_job_controller_judges_a_removed_pod_by_the_first_matching_rule(
    what: str, rules: list[dict[str, Any]] | None, the_pod: Pod, evicting: bool, outcome: Outcome
) -> None:
    facts = JobFacts.from_job(job(rules=rules))
    assert judge_removal(facts, the_pod, evicting=evicting).outcome is outcome, what


@pytest.mark.parametrize(
    ("what", "the_job", "pending", "verdict", "after"),
    [
        (
            "an evicted pod of a Job ignoring disruptions costs nothing, even at backoffLimit 0",
            job(backoff_limit=0, rules=[IGNORE_DISRUPTIONS]),
            frozenset(),
            Verdict.FREE,
            None,
        ),
        (
            "with backoffLimit 0 and no pod failure policy, a move would fail the Job",
            job(backoff_limit=0),
            frozenset(),
            Verdict.WOULD_FAIL_JOB,
            1,
        ),
        (
            "with room left, a move costs one retry",
            job(backoff_limit=6, failed=2),
            frozenset(),
            Verdict.COUNTED,
            3,
        ),
        (
            "the move that brings failures up to backoffLimit uses the last retry",
            job(backoff_limit=3, failed=2),
            frozenset(),
            Verdict.LAST_RETRY,
            3,
        ),
        (
            "failures not yet counted in status count: another move in flight",
            job(backoff_limit=1),
            frozenset({"other-pod-uid"}),
            Verdict.WOULD_FAIL_JOB,
            2,
        ),
        (
            "the pod's own uid among the pending failures is not counted twice",
            job(backoff_limit=1),
            frozenset({uid("report-x7k2p")}),
            Verdict.LAST_RETRY,
            1,
        ),
        (
            "the controller's uncounted failures count",
            job(backoff_limit=2, failed=1, uncounted=["u1"]),
            frozenset({"u1"}),
            Verdict.WOULD_FAIL_JOB,
            3,
        ),
    ],
)
def test_a_counted_move_is_made_only_while_the_job_has_a_retry_for_it(
    what: str, the_job: Job, pending: frozenset[str], verdict: Verdict, after: int | None
) -> None:
    cost = move_cost(JobFacts.from_job(the_job), PULL_FAILING, evicting=True, pending=pending)
    assert (cost.verdict, cost.failures_after) == (verdict, after), what
    assert cost.allowed is (verdict in (Verdict.FREE, Verdict.COUNTED, Verdict.LAST_RETRY))


def test_a_refused_move_says_how_to_make_moves_free() -> None:
    never = move_cost(
        JobFacts.from_job(job(backoff_limit=0)), PULL_FAILING, evicting=True, pending=frozenset()
    )
    assert "backoffLimit 0" in never.message
    assert "kn-rescheduler.io/ignore-disruptions" in never.message
    on_failure = move_cost(
        JobFacts.from_job(job(restart="OnFailure", backoff_limit=0)),
        CRASH_LOOPING,
        evicting=True,
        pending=frozenset(),
    )
    assert on_failure.verdict is Verdict.WOULD_FAIL_JOB
    assert "OnFailure cannot ignore disruptions" in on_failure.message


@pytest.mark.parametrize(
    ("what", "so_far", "limit", "verdict"),
    [
        ("an index with failures to spare is moved at the cost of one", "0", 2, Verdict.COUNTED),
        ("the move that uses the index's last retry is made, and said", "1", 2, Verdict.LAST_RETRY),
        ("a move that would fail the index is not made", "2", 2, Verdict.WOULD_FAIL_INDEX),
    ],
)
def test_with_backoff_limit_per_index_the_count_is_the_pods_index(
    what: str, so_far: str, limit: int, verdict: Verdict
) -> None:
    the_pod = copy.deepcopy(PULL_FAILING)
    the_pod["metadata"].setdefault("annotations", {})[JOB_INDEX_FAILURE_COUNT_ANNOTATION] = so_far
    # The global backoffLimit is not what holds with a per-index limit.
    facts = JobFacts.from_job(job(backoff_limit=0, per_index=limit))
    assert move_cost(facts, the_pod, evicting=True, pending=frozenset()).verdict is verdict, what


def test_pending_failures_are_the_ones_the_controller_has_not_counted_yet() -> None:
    deleting = job_pod(PULL_FAILING, name="report-aaaaa", deletionTimestamp="2026-11-23T10:00:00Z")
    counted_already = job_pod(
        PULL_FAILING, name="report-bbbbb", finalizer=False, deletionTimestamp="2026-11-23T10:00:00Z"
    )
    failed = job_pod(
        job_pod(pod(phase="Failed", containers=[terminated("Error", 1)], owner=("Job", "report"))),
        name="report-ccccc",
    )
    recorded_not_yet_removed = job_pod(PULL_FAILING, name="report-ddddd")
    healthy = job_pod(RUNNING, name="report-eeeee")
    succeeded = job_pod(
        pod(phase="Succeeded", containers=[terminated("Completed", 0)], owner=("Job", "report")),
        name="report-fffff",
        deletionTimestamp="2026-11-23T10:00:00Z",
    )
    facts = JobFacts.from_job(job(uncounted=["already-uncounted"]))
    pending = pending_failures(
        facts,
        [deleting, counted_already, failed, recorded_not_yet_removed, healthy, succeeded],
        moving=[uid("report-ddddd"), "a-pod-long-gone"],
    )
    assert pending == {
        "already-uncounted",
        uid("report-aaaaa"),
        uid("report-ccccc"),
        uid("report-ddddd"),
    }


# -- the webhook's rule -----------------------------------------------------------------------


def apply(the_job: Job, patch: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    return cast(dict[str, Any], jsonpatch.apply_patch(the_job, list(patch)))


def test_a_job_that_asks_gets_the_ignore_disruptions_rule_and_the_replacement_policy_it_needs() -> (
    None
):
    submitted = job()
    mutation = ignore_disruptions(submitted, opted_in=True, asked=True)
    created = apply(submitted, mutation.patch)
    assert created["spec"]["podFailurePolicy"] == {"rules": [IGNORE_DISRUPTIONS]}
    # Defaulted to TerminatingOrFailed before admission; validation requires Failed now.
    assert created["spec"]["podReplacementPolicy"] == "Failed"
    # Nothing else changed.
    created["spec"].pop("podFailurePolicy")
    created["spec"]["podReplacementPolicy"] = "TerminatingOrFailed"
    assert created == submitted


@pytest.mark.parametrize(
    ("what", "the_job", "opted_in", "asked", "why"),
    [
        ("a Job that did not ask", job(), True, False, "not asked"),
        ("a Job whose policy allows no moves", job(), False, True, "allows no moves"),
        (
            "a Job with restartPolicy OnFailure (the API would refuse the policy)",
            job(restart="OnFailure"),
            True,
            True,
            "requires Never",
        ),
        (
            "a Job with a pod failure policy of its own",
            job(rules=[{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}}]),
            True,
            True,
            "left alone",
        ),
        (
            "a Job managed by another controller",
            job(managed_by="kueue.x-k8s.io/multikueue"),
            True,
            True,
            "managed by",
        ),
    ],
)
def test_the_webhook_leaves_a_job_alone_unless_the_rule_is_wanted_and_valid(
    what: str, the_job: Job, opted_in: bool, asked: bool, why: str
) -> None:
    mutation = ignore_disruptions(the_job, opted_in=opted_in, asked=asked)
    assert not mutation.changed, what
    assert any(why in reason for reason in mutation.reasons), mutation.reasons
