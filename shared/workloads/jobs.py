"""What moving a Job's pod costs the Job, and how to make it cost nothing.

A move removes a pod. The Job controller (Kubernetes 1.36, ``pkg/controller/job``) then decides
whether that pod was a *failure* that counts against ``backoffLimit``:

- ``isPodFailed``: a pod in phase Failed is failed; without ``podReplacementPolicy: Failed``
  (implied by a ``podFailurePolicy``) a pod that is merely being deleted counts already, as
  soon as it has a deletionTimestamp. So, by default, every move is one failure, and a Job with
  ``backoffLimit: 0`` fails at its first move (``exceedsBackoffLimit``: failed > backoffLimit).
- ``matchPodFailurePolicy``: with a ``podFailurePolicy``, the first rule matching the failed pod
  decides: ``Ignore`` does not count it, ``Count`` counts it, ``FailIndex`` fails its index,
  ``FailJob`` fails the whole Job. ``onPodConditions`` rules match the pod's conditions, and the
  Eviction API sets ``DisruptionTarget=True`` (reason EvictionByEvictionAPI) before it deletes;
  a plain DELETE sets none. ``onExitCodes`` rules match non-zero exit codes of terminated
  containers (a running container killed on its way out exits non-zero too).
- With ``backoffLimitPerIndex`` the count is per index (the pod's
  ``batch.kubernetes.io/job-index-failure-count`` annotation holds it so far).
- The pod-failure back-off (10 s doubling, ``backoff_utils.go``) delays the replacement after
  *every* failed pod, ignored ones included; it runs from the pod's finish time, which for a
  pod that never started is its Ready=False transition (long ago for a pod failing to pull),
  so in practice a moved Pending pod is replaced at once.

Hence: Job pods are always moved with the Eviction API, so an ``Ignore`` rule on
``DisruptionTarget`` (the one Kubernetes recommends for disruptions, and the one the webhook
adds on request, see ``ignore_disruptions``) makes the move free. A move the Job controller
would count is only made while the Job has a retry left for it; one that would fail the Job
(or its index) is not made at all: the pod stays and an Event says why. Moving a failing pod
must never be what fails a user's Job.

``restartPolicy: OnFailure`` Jobs cannot have a pod failure policy. Each move counts one
failure; in exchange the moved pod's container restarts leave the count that
``pastBackoffLimitOnFailure`` keeps (the sum of restartCounts of the Job's running and pending
pods, which fails the Job at backoffLimit as well): a crash loop on a broken node would fail
the Job anyway, one restart at a time.

Everything here is pure: the handler reads the Job (the state's holder) and, for a counted
move only, lists the Job's pods.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, cast

import jsonpatch

from shared.api.keys import (
    DISRUPTION_TARGET_CONDITION,
    JOB_INDEX_FAILURE_COUNT_ANNOTATION,
    JOB_TRACKING_FINALIZER,
)
from shared.api.kubetypes import Job, Pod, PodFailurePolicyRule

# The Job controller's defaults (k8s.io/api/batch/v1 and pkg/apis/batch/v1/defaults.go).
DEFAULT_BACKOFF_LIMIT: Final = 6
# spec.managedBy: only Jobs the built-in controller manages follow these rules.
BUILTIN_JOB_CONTROLLER: Final = "kubernetes.io/job-controller"
# Validation allows at most this many pod failure policy rules (pkg/apis/batch/validation).
MAX_POD_FAILURE_POLICY_RULES: Final = 20

IGNORE: Final = "Ignore"
COUNT: Final = "Count"
FAIL_JOB: Final = "FailJob"
FAIL_INDEX: Final = "FailIndex"


def ignore_disruptions_rule() -> PodFailurePolicyRule:
    """The rule the webhook adds: exactly the documented "ignore disruptions" rule."""
    return {
        "action": IGNORE,
        "onPodConditions": [{"type": DISRUPTION_TARGET_CONDITION, "status": "True"}],
    }


class Outcome(StrEnum):
    """What the Job controller will make of the removed pod."""

    # Not a failure: backoffLimit untouched.
    IGNORED = "ignored"
    # One failure against backoffLimit (or the index's backoffLimitPerIndex).
    COUNTED = "counted"
    # A FailJob rule matches: the Job fails.
    FAILS_JOB = "fails-job"
    # A FailIndex rule matches: the pod's index fails.
    FAILS_INDEX = "fails-index"


@dataclass(frozen=True)
class Rule:
    action: str
    # onExitCodes: (operator, values, container name or None); None for a condition rule.
    exit_codes: tuple[str, tuple[int, ...], str | None] | None = None
    # onPodConditions: (type, status) patterns.
    conditions: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class JobFacts:
    """The parts of a Job (spec and status) that decide what a move costs."""

    name: str
    restart_policy: str
    backoff_limit: int = DEFAULT_BACKOFF_LIMIT
    backoff_limit_per_index: int | None = None
    # None: no podFailurePolicy.
    rules: tuple[Rule, ...] | None = None
    managed_by: str | None = None
    # status.failed and the uids in status.uncountedTerminatedPods.failed.
    failed: int = 0
    uncounted_failed: frozenset[str] = field(default_factory=frozenset)

    @property
    def builtin(self) -> bool:
        return self.managed_by in (None, "", BUILTIN_JOB_CONTROLLER)

    @classmethod
    def from_job(cls, job: Mapping[str, Any]) -> JobFacts:
        """Read leniently: a field of the wrong type reads as its default (the API server
        validated the Job; this only guards against a hand-made object)."""
        typed = cast(Job, job)
        spec = typed.get("spec") or {}
        status = typed.get("status") or {}
        template = spec.get("template") or {}
        policy = spec.get("podFailurePolicy")
        rules: tuple[Rule, ...] | None = None
        if isinstance(policy, Mapping):
            rules = tuple(_rule(raw) for raw in policy.get("rules") or [] if isinstance(raw, dict))
        uncounted = (status.get("uncountedTerminatedPods") or {}).get("failed") or []
        per_index = spec.get("backoffLimitPerIndex")
        managed = spec.get("managedBy")
        return cls(
            name=str((typed.get("metadata") or {}).get("name", "")),
            restart_policy=str((template.get("spec") or {}).get("restartPolicy", "")),
            backoff_limit=_count(spec.get("backoffLimit"), DEFAULT_BACKOFF_LIMIT),
            backoff_limit_per_index=per_index if _is_count(per_index) else None,
            rules=rules,
            managed_by=managed if isinstance(managed, str) else None,
            failed=_count(status.get("failed"), 0),
            uncounted_failed=frozenset(u for u in uncounted if isinstance(u, str)),
        )


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _count(value: object, default: int) -> int:
    return value if isinstance(value, int) and _is_count(value) else default


def _rule(raw: Mapping[str, Any]) -> Rule:
    action = str(raw.get("action", ""))
    codes = raw.get("onExitCodes")
    if isinstance(codes, Mapping):
        values = tuple(v for v in codes.get("values") or [] if isinstance(v, int))
        name = codes.get("containerName")
        return Rule(action, (str(codes.get("operator", "")), values, name or None))
    patterns = tuple(
        (str(p.get("type", "")), str(p.get("status", "")))
        for p in raw.get("onPodConditions") or []
        if isinstance(p, Mapping)
    )
    return Rule(action, conditions=patterns)


@dataclass(frozen=True)
class Judgement:
    outcome: Outcome
    # Why, in words (which rule decided, or that none could).
    why: str


def judge_removal(job: JobFacts, pod: Pod, *, evicting: bool) -> Judgement:
    """What the Job controller will make of ``pod`` once we remove it (``matchPodFailurePolicy``
    evaluated on the pod as it will be when terminal).

    Evicted, the pod carries ``DisruptionTarget=True``. Exit codes: a container already
    terminated keeps its exit code; a running one is killed and exits non-zero with a code we
    cannot know (137 or 143, or its own on SIGTERM), so an ``onExitCodes`` rule that could
    match it is read as matching when it would not ignore the failure: never guess in the
    Job's disfavour.
    """
    if job.rules is None:
        return Judgement(Outcome.COUNTED, "the Job has no podFailurePolicy")
    conditions = {
        (str(c.get("type", "")), str(c.get("status", "")))
        for c in (pod.get("status") or {}).get("conditions") or []
    }
    if evicting:
        conditions.add((DISRUPTION_TARGET_CONDITION, "True"))
    for index, rule in enumerate(job.rules):
        where = f"podFailurePolicy rule {index} ({rule.action})"
        if rule.exit_codes is not None:
            match = _exit_codes_match(rule.exit_codes, pod)
            if match is False:
                continue
            if match is None:
                if rule.action == IGNORE:
                    # An Ignore it might not reach is no promise: read on as if it missed,
                    # and the outcome is at best what a later rule says.
                    continue
                return Judgement(
                    _outcome(rule.action),
                    f"{where} matches exit codes, and a container still running would exit "
                    "with a code we cannot know",
                )
            return Judgement(_outcome(rule.action), f"{where} matches the exit codes")
        if any(pattern in conditions for pattern in rule.conditions):
            matched = ", ".join(f"{t}={s}" for t, s in rule.conditions if (t, s) in conditions)
            return Judgement(_outcome(rule.action), f"{where} matches the condition {matched}")
    return Judgement(Outcome.COUNTED, "no podFailurePolicy rule matches the removed pod")


def _outcome(action: str) -> Outcome:
    return {
        IGNORE: Outcome.IGNORED,
        FAIL_JOB: Outcome.FAILS_JOB,
        FAIL_INDEX: Outcome.FAILS_INDEX,
    }.get(action, Outcome.COUNTED)


def _exit_codes_match(
    requirement: tuple[str, tuple[int, ...], str | None], pod: Pod
) -> bool | None:
    """True/False when the terminated containers decide it; None when a running container
    (killed on removal, exit code unknown) could still match."""
    operator, values, only = requirement
    status = pod.get("status") or {}
    unknown = False
    for cs in [
        *(status.get("containerStatuses") or []),
        *(status.get("initContainerStatuses") or []),
    ]:
        if only is not None and cs.get("name") != only:
            continue
        state = cs.get("state") or {}
        terminated = state.get("terminated")
        if terminated is not None:
            code = terminated.get("exitCode", 0)
            if code != 0 and ((code in values) == (operator == "In")):
                return True
        elif state.get("running") is not None:
            unknown = True
        # Waiting: a container that never ran, or one in back-off whose last exit is in
        # lastState. The kubelet keeps that last exit as the terminated state of a deleted
        # pod, so it is the code the Job controller will see.
        else:
            last = (cs.get("lastState") or {}).get("terminated")
            if last is not None:
                code = last.get("exitCode", 0)
                if code != 0 and ((code in values) == (operator == "In")):
                    return True
    return None if unknown else False


def pending_failures(job: JobFacts, pods: Iterable[Pod], moving: Iterable[str]) -> frozenset[str]:
    """Uids of the Job's pods the controller will count as failed but has not added to
    ``status.failed`` yet: its own uncounted list, its pods being removed or failed that still
    carry its tracking finalizer (it has not counted them), and pods we recorded a move for
    (``moving``: the state's handled uids) that are still there, their removal in flight."""
    pending = set(job.uncounted_failed)
    handled = set(moving)
    for pod in pods:
        meta = pod.get("metadata") or {}
        uid = meta.get("uid", "")
        if not uid:
            continue
        phase = (pod.get("status") or {}).get("phase")
        if phase == "Succeeded":
            continue
        tracked = JOB_TRACKING_FINALIZER in (meta.get("finalizers") or [])
        going = bool(meta.get("deletionTimestamp")) or phase == "Failed"
        if (going and tracked) or (uid in handled and not going):
            pending.add(uid)
    return frozenset(pending)


class Verdict(StrEnum):
    FREE = "free"
    COUNTED = "counted"
    # Counted, and it uses the Job's last retry: said in a Warning.
    LAST_RETRY = "last-retry"
    WOULD_FAIL_JOB = "would-fail-job"
    WOULD_FAIL_INDEX = "would-fail-index"


@dataclass(frozen=True)
class MoveCost:
    verdict: Verdict
    message: str
    # Failures counted after the move, and the limit they are held against (None when free).
    failures_after: int | None = None
    limit: int | None = None

    @property
    def allowed(self) -> bool:
        return self.verdict in (Verdict.FREE, Verdict.COUNTED, Verdict.LAST_RETRY)


def move_cost(job: JobFacts, pod: Pod, *, evicting: bool, pending: frozenset[str]) -> MoveCost:
    """Whether moving ``pod`` is free, counted, or would fail the Job; ``pending`` is
    ``pending_failures`` (this pod's own uid in it is not counted twice)."""
    meta = pod.get("metadata") or {}
    uid = meta.get("uid", "")
    name = meta.get("name", "")
    judged = judge_removal(job, pod, evicting=evicting)
    if judged.outcome is Outcome.IGNORED:
        return MoveCost(
            Verdict.FREE,
            f"the Job does not count the move of pod {name} ({judged.why})",
        )
    if judged.outcome is Outcome.FAILS_JOB:
        return MoveCost(
            Verdict.WOULD_FAIL_JOB,
            f"moving pod {name} would fail Job {job.name}: {judged.why}",
        )
    if job.backoff_limit_per_index is not None:
        return _per_index(job, pod, name, judged)
    # (FailIndex needs backoffLimitPerIndex, validation says; without it, read as counted.)
    others = len(pending - {uid})
    after = job.failed + others + 1
    limit = job.backoff_limit
    counted = (
        f"the Job counts it as a failed pod ({judged.why}): {after} failure(s) against "
        f"backoffLimit {limit}"
    )
    if after > limit:
        return MoveCost(
            Verdict.WOULD_FAIL_JOB,
            f"moving pod {name} would fail Job {job.name}: {counted}. {_how_to_free(job)}",
            after,
            limit,
        )
    verdict = Verdict.LAST_RETRY if after == limit else Verdict.COUNTED
    return MoveCost(
        verdict, f"moving pod {name} costs Job {job.name} a retry: {counted}", after, limit
    )


def _per_index(job: JobFacts, pod: Pod, name: str, judged: Judgement) -> MoveCost:
    limit = job.backoff_limit_per_index
    assert limit is not None
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(
        JOB_INDEX_FAILURE_COUNT_ANNOTATION, "0"
    )
    so_far = int(raw) if raw.isascii() and raw.isdigit() else 0
    after = so_far + 1
    if judged.outcome is Outcome.FAILS_INDEX or after > limit:
        why = (
            judged.why
            if judged.outcome is Outcome.FAILS_INDEX
            else (f"{after} failure(s) of its index against backoffLimitPerIndex {limit}")
        )
        return MoveCost(
            Verdict.WOULD_FAIL_INDEX,
            f"moving pod {name} would fail its index of Job {job.name}: {why}. {_how_to_free(job)}",
            after,
            limit,
        )
    verdict = Verdict.LAST_RETRY if after == limit else Verdict.COUNTED
    return MoveCost(
        verdict,
        f"moving pod {name} costs its index of Job {job.name} a retry ({judged.why}): "
        f"{after} failure(s) against backoffLimitPerIndex {limit}",
        after,
        limit,
    )


def _how_to_free(job: JobFacts) -> str:
    if job.restart_policy != "Never":
        return (
            "A Job with restartPolicy OnFailure cannot ignore disruptions; a higher "
            "backoffLimit leaves room for moves"
        )
    return (
        "A podFailurePolicy rule {action: Ignore, onPodConditions: [{type: DisruptionTarget, "
        'status: "True"}]} makes moves free (the webhook adds it to new Jobs annotated '
        'kn-rescheduler.io/ignore-disruptions: "true")'
    )


# -- the webhook: making moves free for a Job being created ----------------------------------


@dataclass(frozen=True)
class JobMutation:
    # RFC 6902 operations turning the submitted Job into ``job``; empty when nothing changes.
    patch: tuple[dict[str, Any], ...] = field(default=(), hash=False)
    reasons: tuple[str, ...] = ()
    job: Job = field(default_factory=lambda: cast(Job, {}), hash=False, compare=False)

    @property
    def changed(self) -> bool:
        return bool(self.patch)

    def patch_json(self) -> bytes:
        """The patch as the AdmissionResponse wants it (before base64)."""
        return json.dumps(list(self.patch), separators=(",", ":")).encode()


def ignore_disruptions(job: Job, *, opted_in: bool, asked: bool) -> JobMutation:
    """The patch that gives a Job being created the ``Ignore DisruptionTarget`` rule.

    Only when asked (the annotation), opted in (a policy allowing moves), and valid: the API
    server applies our patch after we answer and refuses an invalid Job, which
    ``failurePolicy: Ignore`` does not cover. A pod failure policy requires
    ``restartPolicy: Never`` and ``podReplacementPolicy: Failed``; the Job arrives defaulted, so
    a ``TerminatingOrFailed`` seen here is usually the default (set when there was no policy),
    and is changed to ``Failed``: replacements then wait until the old pod is terminal.
    """
    if not asked:
        return JobMutation(reasons=("not asked",), job=job)
    if not opted_in:
        return JobMutation(reasons=("asked, but the Job's policy allows no moves",), job=job)
    spec = job.get("spec") or {}
    restart = ((spec.get("template") or {}).get("spec") or {}).get("restartPolicy")
    if restart != "Never":
        return JobMutation(
            reasons=(
                f"restartPolicy is {restart}: a podFailurePolicy requires Never, so every "
                "move counts against backoffLimit",
            ),
            job=job,
        )
    if spec.get("podFailurePolicy") is not None:
        facts = JobFacts.from_job(job)
        has = any(
            rule.action == IGNORE and (DISRUPTION_TARGET_CONDITION, "True") in rule.conditions
            for rule in facts.rules or ()
        )
        why = "already ignores DisruptionTarget" if has else "is the user's: left alone"
        return JobMutation(reasons=(f"the Job's own podFailurePolicy {why}",), job=job)
    managed = spec.get("managedBy")
    if managed not in (None, "", BUILTIN_JOB_CONTROLLER):
        return JobMutation(reasons=(f"managed by {managed}, not the built-in controller",), job=job)
    changed = copy.deepcopy(job)
    new_spec = changed.setdefault("spec", {})
    new_spec["podFailurePolicy"] = {"rules": [ignore_disruptions_rule()]}
    reasons = ["added podFailurePolicy: Ignore on DisruptionTarget"]
    if new_spec.get("podReplacementPolicy") not in (None, "Failed"):
        reasons.append(
            f"podReplacementPolicy {new_spec.get('podReplacementPolicy')} -> Failed "
            "(required with a podFailurePolicy)"
        )
    if "podReplacementPolicy" in new_spec:
        new_spec["podReplacementPolicy"] = "Failed"
    patch = tuple(jsonpatch.make_patch(job, changed).patch)
    return JobMutation(patch=patch, reasons=tuple(reasons), job=changed)
