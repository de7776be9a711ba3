"""``explain POD``: what kn-rescheduler will do about a live pod, and why, by its own code.

Three functions judge a pod, and this runs each of them on what the cluster shows now:

1. detect-failures: ``shared.pods.detect_failures.decide.detect`` on the event ApiServerSource
   would send for the pod as it is (an update carrying the whole pod);
2. sweep-failures: ``shared.pods.sweep_failures.handler.find_failures`` on the pod beside the
   other pods of its controller, with the kubelets' Warning Events about them and the image
   pulls, as the sweep lists them;
3. update-annotations, when either found a failure: its ``Rescheduler`` handles the failing-pod
   event it would receive, with every write sent as a server-side dry run (``dryRun=All``: the
   API server validates and admits it, and stores nothing). Its trace is what it decided, and
   its calls are what it would write.

So the verdicts are the functions' (tests/unit/test_plugin_explain.py holds them to the
functions' on the pods real kubelets wrote), judged with the installed settings. What the plugin
adds is only the words for a pod no function reports: why not, naming the rule's section in
docs/failure-rules.md.

The dry runs need the rights of the writes (``patch`` on the workload, ``create`` on
evictions); credentials that lack them get the verdicts and a sentence saying the plan could
not be checked.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from kubectl_kn_rescheduler.reading import RULES, UsageError, section
from shared.api.keys import (
    APISERVER_UPDATE,
    EVENT_POD_FAILING,
    OPTED_IN_LABEL,
    OPTED_IN_VALUE,
    POLICY_ANNOTATION,
    POLICY_STAMP_ANNOTATION,
)
from shared.api.kubetypes import Pod
from shared.platform import events, kube
from shared.platform.config import Config
from shared.pods.detect_failures.decide import detect
from shared.pods.failing import FailingPod
from shared.pods.sweep_failures.handler import find_failures
from shared.pods.update_annotations.handler import Rescheduler, last_trace
from shared.workloads.classify import (
    STUCK_PENDING,
    FailureKind,
    controller_of,
    policy_of,
    skip_reason,
)
from shared.workloads.podevents import (
    FAILED_CREATE_POD_SANDBOX,
    ImagePull,
    image_pulls,
    warning_events,
)
from shared.workloads.podshape import MalformedPod
from shared.workloads.policy import InvalidPolicy

# The section of docs/failure-rules.md that says each verdict's rule (tests check they exist).
NEVER_MOVED: Final = "Never moved"
REPEATED: Final = "Moved after repeated failures"
FIRST_SIGHT: Final = "Moved at first sight"
POD_FAILED: Final = "The pod failed (`status.phase: Failed`, `status.reason`)"
WAITING: Final = "A container waits (`state.waiting.reason`)"
TERMINATED: Final = "A container terminated (`state.terminated` / `lastState.terminated`)"
STUCK: Final = "Stuck on a node (found by the sweep)"
FAST_PATHS: Final = "Moved sooner with evidence beside the pod (the fast paths)"
EXCLUSIONS: Final = "Unschedulable because of our exclusions"
# Where the opted-in label the ApiServerSource selects on is explained.
OPT_IN: Final = "docs/install-opt-in.md"
OPTED_IN_SECTION: Final = "Which pods produce events: the `kn-rescheduler.io/opted-in` label"
# The reasons a container's last run ended with, which the terminated rules judge.
TERMINATED_REASONS: Final = frozenset({"OOMKilled", "Error", "ContainerCannotRun", "StartError"})
HEADINGS: Final = (
    NEVER_MOVED,
    REPEATED,
    FIRST_SIGHT,
    POD_FAILED,
    WAITING,
    TERMINATED,
    STUCK,
    FAST_PATHS,
    EXCLUSIONS,
)


@dataclass(frozen=True)
class Verdict:
    """One function's answer about the pod: a failure it reports, or why it reports none."""

    function: str
    failing: FailingPod | None
    why: str
    rule: str
    # The page the rule's heading is in.
    doc: str = RULES

    @property
    def kind(self) -> str | None:
        return str(self.failing.failure.kind) if self.failing else None

    @property
    def reason(self) -> str | None:
        return self.failing.failure.reason if self.failing else None

    def as_json(self) -> dict[str, Any]:
        return {
            "function": self.function,
            "failing": self.failing is not None,
            "kind": self.kind,
            "reason": self.reason,
            "why": self.why,
            "rule": section(self.doc, self.rule),
        }


def pod_event(pod: Mapping[str, Any]) -> events.Event:
    """The event ApiServerSource (Resource mode) sends for the pod's latest update."""
    meta = pod.get("metadata") or {}
    attributes = {
        "specversion": "1.0",
        "id": f"explain-{uuid.uuid4()}",
        "source": "kubectl-kn-rescheduler",
        "type": APISERVER_UPDATE,
        "subject": f"/apis/v1/namespaces/{meta.get('namespace')}/pods/{meta.get('name')}",
        "kind": "Pod",
        "apiversion": "v1",
        "name": str(meta.get("name", "")),
        "namespace": str(meta.get("namespace", "")),
        "datacontenttype": "application/json",
    }
    return events.Event(attributes["id"], attributes["source"], APISERVER_UPDATE, attributes, pod)


def _rule_of(failing: FailingPod) -> str:
    failure = failing.failure
    if failure.kind is FailureKind.EARLY:
        return FAST_PATHS
    if failure.kind is FailureKind.EXCLUSIONS_UNSCHEDULABLE:
        return EXCLUSIONS
    if failure.reason in (STUCK_PENDING, FAILED_CREATE_POD_SANDBOX):
        return STUCK
    if failure.container is None:
        return POD_FAILED
    if failure.reason in TERMINATED_REASONS:
        return TERMINATED
    return WAITING


def _none_reported(pod: Pod, cfg: Config) -> tuple[str, str]:
    """Why no function reports ``pod`` (the words, and the rule's section)."""
    skip = skip_reason(pod, cfg)
    if skip:
        return f"never moved: {skip}", NEVER_MOVED
    policy = policy_of(pod)
    if policy is None and not cfg.forward_unstamped:
        return (
            f"not opted in: the pod carries no {POLICY_STAMP_ANNOTATION} stamp (its owner has no "
            f"{POLICY_ANNOTATION}, or the pod was created before admission stamped it), "
            "and no function forwards an unstamped pod",
            NEVER_MOVED,
        )
    if isinstance(policy, InvalidPolicy):
        return f"its policy is refused: {policy.reason}", NEVER_MOVED
    if policy == 0:
        return f'{POLICY_ANNOTATION} is "0": moves turned off', NEVER_MOVED
    return f"no failure the rules count yet: {_what_it_shows(pod)}", REPEATED


def _what_it_shows(pod: Pod) -> str:
    status: Mapping[str, Any] = pod.get("status") or {}
    said = [f"phase {status.get('phase', 'unknown')}"]
    statuses: list[Mapping[str, Any]] = [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]
    for s in statuses:
        state: Mapping[str, Any] = s.get("state") or {}
        now = next(iter(state), "unknown")
        block = state.get(now)
        detail = block.get("reason") if isinstance(block, dict) else None
        said.append(
            f"container {s.get('name')} {now}"
            + (f" ({detail})" if detail else "")
            + f", {s.get('restartCount', 0)} restart(s)"
        )
    return "; ".join(said)


def judge(
    pod: Pod,
    cfg: Config,
    now: datetime,
    *,
    siblings: Sequence[Pod] = (),
    kubelet_events: Sequence[Mapping[str, Any]] = (),
    neighbours: Sequence[Pod] = (),
) -> tuple[Verdict, Verdict]:
    """detect-failures' and the sweep's verdicts on ``pod`` at ``now`` (pure).

    ``siblings`` are the other pods of its controller, ``neighbours`` the other pods on its node
    (a pull queued behind theirs is not judged early), and ``kubelet_events`` the Events about
    them all, as the sweep lists them (the Warning ones and the image pulls are taken out here,
    by the functions' own readers).
    """
    try:
        reply = detect(pod_event(pod), cfg, now)
    except events.BadEvent as exc:
        raise UsageError(f"not a pod the functions can judge: {exc}") from exc
    uid = str((pod.get("metadata") or {}).get("uid", ""))
    warnings = warning_events(kubelet_events)
    pulls: dict[str, tuple[ImagePull, ...]] = image_pulls(kubelet_events)
    try:
        seen = {str((pod.get("metadata") or {}).get("uid", ""))}
        listed: list[Pod] = [pod]
        for other in [*siblings, *neighbours]:
            other_uid = str((other.get("metadata") or {}).get("uid", ""))
            if other_uid not in seen:
                seen.add(other_uid)
                listed.append(other)
        found = find_failures(listed, cfg, now, warnings, lambda: pulls)
    except MalformedPod as exc:  # pragma: no cover - detect refused it first
        raise UsageError(f"not a pod the functions can judge: {exc}") from exc
    swept = next((f for f in found if f.uid == uid), None)
    none_why, none_rule = _none_reported(pod, cfg)
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if reply is not None and labels.get(OPTED_IN_LABEL) != OPTED_IN_VALUE:
        # The ApiServerSource selects pods on the label admission puts on opted-in pods: none
        # of this pod's changes reach detect-failures (knative/sources.yaml).
        first = Verdict(
            "detect-failures",
            None,
            f"no event of this pod reaches it: the ApiServerSource sends only pods labelled "
            f"{OPTED_IN_LABEL}={OPTED_IN_VALUE}, which admission puts on opted-in pods (this one "
            "was created before, or the label was removed); the sweep judges it",
            OPTED_IN_SECTION,
            OPT_IN,
        )
    elif reply is not None:
        detected = FailingPod.from_data(reply.data)
        said = detected.failure.why or detected.failure.message
        first = Verdict("detect-failures", detected, said, _rule_of(detected))
    else:
        first = Verdict("detect-failures", None, none_why, none_rule)
    if swept is not None:
        said = swept.failure.why or swept.failure.message
        second = Verdict("sweep-failures", swept, said, _rule_of(swept))
    else:
        second = Verdict("sweep-failures", None, none_why, none_rule)
    return first, second


@dataclass(frozen=True)
class Action:
    """What update-annotations made of the failure: its trace, the calls it would send, its
    reply, or why that could not be checked."""

    steps: tuple[str, ...]
    calls: tuple[str, ...]
    reply: str | None
    error: str = ""
    # Calls your credentials were refused: the functions' own would make them.
    refused: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "steps": list(self.steps),
            "calls": list(self.calls),
            "reply": self.reply,
            "error": self.error or None,
            "refused": list(self.refused),
        }


def act(api: kube.Kube, cfg: Config, failing: FailingPod, source: str) -> Action:
    """update-annotations' handling of ``failing``, every write a server-side dry run."""
    event = events.Event(
        f"explain-{uuid.uuid4()}",
        f"/kn-rescheduler/{source}",
        EVENT_POD_FAILING,
        {"subject": failing.subject},
        failing.to_data(),
    )
    steps: list[str] = []
    error = ""
    reply: str | None = None
    with kube.recording() as calls, kube.forced_dry_run(True):
        try:
            answered = Rescheduler(api.with_options(dry_run=True), cfg).handle(event)
            if answered is not None:
                reply = f"{answered.type} {answered.subject}"
        except kube.Forbidden as exc:
            error = (
                "your credentials may not make the server-side dry run of a write it would "
                f"send, so the plan could not be checked: {exc}"
            )
        except (kube.KubeError, events.BadEvent) as exc:
            error = f"update-annotations would not finish: {exc}"
        finally:
            trace = last_trace()
            if trace is not None:
                steps.extend(trace.steps)
    writes = tuple(c.describe() for c in calls if c.method != "GET")
    refused = tuple(c.describe() for c in calls if c.status in (401, 403))
    return Action(tuple(steps), writes, reply, error, refused)


@dataclass(frozen=True)
class Explanation:
    namespace: str
    name: str
    node: str
    owner: str
    settings: str
    verdicts: tuple[Verdict, Verdict]
    action: Action | None = None
    notes: tuple[str, ...] = field(default=())

    def as_json(self) -> dict[str, Any]:
        return {
            "pod": f"{self.namespace}/{self.name}",
            "node": self.node,
            "owner": self.owner,
            "settings": self.settings,
            "verdicts": [v.as_json() for v in self.verdicts],
            "updateAnnotations": self.action.as_json() if self.action else None,
            "notes": list(self.notes),
        }


def explain(
    api: kube.Kube,
    cfg: Config,
    settings: str,
    namespace: str,
    name: str,
    *,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> Explanation:
    """Read the pod, its siblings and the Events about them; judge; act in a dry run."""
    try:
        pod: Pod = api.get("Pod", namespace, name)  # type: ignore[assignment]
    except kube.NotFound as exc:
        raise UsageError(f"pod {namespace}/{name} not found") from exc
    owner = controller_of(pod)
    siblings: list[Pod] = []
    if owner is not None and owner.get("uid"):
        siblings = [
            p  # type: ignore[misc]
            for p in api.list_all("Pod", namespace)
            if p["metadata"].get("uid") != pod["metadata"].get("uid")
            and (controller_of(p) or {}).get("uid") == owner.get("uid")  # type: ignore[arg-type]
        ]
    node = (pod.get("spec") or {}).get("nodeName")
    neighbours: list[Pod] = []
    notes: list[str] = []
    if node:
        try:
            neighbours = list(
                api.list_all("Pod", None, field_selector=f"spec.nodeName={node}")  # type: ignore[arg-type]
            )
        except kube.Forbidden:
            notes.append(
                f"the pods of other namespaces on {node} could not be listed (forbidden): the "
                "sweep weighs them for an image pull queued behind theirs"
            )
    about = {str(p["metadata"].get("uid")) for p in [pod, *siblings]}
    kubelet_events = [
        e
        for e in api.list_all("Event", namespace, field_selector="involvedObject.kind=Pod")
        if (e.get("involvedObject") or {}).get("uid") in about
    ]
    verdicts = judge(
        pod,
        cfg,
        clock(),
        siblings=siblings,
        kubelet_events=kubelet_events,
        neighbours=neighbours,
    )
    failing = next((v for v in verdicts if v.failing is not None), None)
    action = (
        act(api, cfg, failing.failing, failing.function) if failing and failing.failing else None
    )
    return Explanation(
        namespace=namespace,
        name=name,
        node=str((pod.get("spec") or {}).get("nodeName") or "(not scheduled)"),
        owner=f"{owner.get('kind')}/{owner.get('name')}" if owner else "none (a bare pod)",
        settings=settings,
        verdicts=verdicts,
        action=action,
        notes=tuple(notes),
    )


def render(explanation: Explanation) -> list[str]:
    """The explanation in sentences (pure)."""
    e = explanation
    out = [
        f"pod {e.namespace}/{e.name} on {e.node}, controller {e.owner}",
        f"  judged with the settings of {e.settings}",
    ]
    out += [f"  note: {note}" for note in e.notes]
    for verdict in e.verdicts:
        if verdict.failing is not None:
            failure = verdict.failing.failure
            head = f"  {verdict.function}: reports {failure.reason} ({failure.kind})"
        else:
            head = f"  {verdict.function}: reports nothing"
        out.append(f"{head}: {verdict.why}")
        out.append(f"    rule: {section(verdict.doc, verdict.rule)}")
    action = e.action
    if action is None:
        out.append(
            "  update-annotations: nothing reaches it; kn-rescheduler leaves the pod where it is"
        )
        return out
    out.append("  update-annotations (every write a server-side dry run, nothing stored):")
    out += [f"    {step}" for step in action.steps]
    if action.calls:
        out.append("    it would send:")
        out += [f"      {call}" for call in action.calls]
    if action.refused:
        out.append(
            "    your credentials were refused these calls, which the function's own are not: "
            "the plan above may differ from what it will do"
        )
        out += [f"      {call}" for call in action.refused]
    if action.error:
        out.append(f"    {action.error}")
    elif action.reply:
        out.append(f"    reply: {action.reply}")
    else:
        out.append("    reply: none (nothing to do now)")
    return out
