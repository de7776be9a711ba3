"""Admission of new pods: the logic of mutate-admission.

The API server calls this on every pod CREATE in the cluster. It must never block pod
creation: it always answers ``allowed: true``; on any internal error or slow API lookup it
allows the pod without a patch and logs why (the registration's ``failurePolicy: Ignore`` only
covers failures to reach us, not a patch that fails to apply, so patches come from
``shared.admission.decide``, correct by construction).

For an opted-in pod it copies the policy, the owner's stuck-after and the excluded nodes from
the owner's state onto the pod, adds the node affinity that keeps the scheduler off them
(none when the policy is 0 or unreadable), and sets the `kn-rescheduler.io/opted-in` label
the ApiServerSource selects on: pods without it never produce a pod event for the pipeline.
A bare pod replaced by update-annotations carries the state in its own annotations, so it
needs no lookup. Node names in a state that Kubernetes would refuse are skipped and logged,
never patched in: the API server would refuse the pod.
A state that is a copy of another object's (a ReplicaSet born with its Deployment's copy after
`kubectl rollout undo`; see "Whose state" in `shared.workloads.state`) gives no exclusions: they
are another ReplicaSet's. A pod that did not opt in only loses stale stamps of ours copied from
elsewhere (the label included).

It is also called on Job CREATE (a second webhook of the same registration): a Job that asks
with ``kn-rescheduler.io/ignore-disruptions: "true"`` (on itself, its CronJob's jobTemplate,
or its CronJob) and opted in gets the pod failure policy that makes our moves free
(``shared.workloads.jobs.ignore_disruptions``); the field is immutable afterwards, so creation is
the only moment. A CronJob's own annotations are not copied onto its Jobs: reading them costs one
GET per Job a CronJob creates, and none for any other Job.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from shared.admission.decide import Mutation, OwnerFacts, SoftAvoid, mutate
from shared.api import movedoff
from shared.api.keys import (
    AVOID_PRESSURE_KEY,
    FAILING_WORKLOADS_LABEL,
    IGNORE_DISRUPTIONS_ANNOTATION,
    LOAD_AWARE_KEY,
    LOAD_HIGH,
    LOAD_LABEL,
    LOAD_MEDIUM,
    LOAD_OVERLOADED,
    MOVED_OFF_LABEL,
    NODE_NAME_FIELD,
    POLICY_ANNOTATION,
    STATE_ANNOTATION,
    STUCK_AFTER_ANNOTATION,
    SUSPECT_LABEL,
    SUSPECT_VALUE,
)
from shared.api.kubetypes import Job, Pod
from shared.api.state import StateError, load_state_lenient
from shared.api.times import format_duration
from shared.platform import kube, metrics
from shared.platform.config import Config
from shared.workloads.classify import controller_of
from shared.workloads.jobs import JobMutation, ignore_disruptions
from shared.workloads.owners import Holder, resolve
from shared.workloads.policy import OwnerKind, parse_retries
from shared.workloads.state import exclusions_for, foreign_copy

log = logging.getLogger(__name__)

# How long a namespace's opt-in labels (pressure, load-aware) are trusted before they are read
# again (seconds), and how many namespaces are remembered.
NAMESPACE_TTL: Final = 30.0
NAMESPACE_CACHE_MAX: Final = 10_000
# The one lookup that is not about the pod's own owners (the Node LISTs for a replacement, two
# at most, sharing it) gets less than the others: the owners' two lookups and this one still
# answer within the registration's timeoutSeconds (5) when the API server is slow, so a slow
# answer costs the preference, never the pod's exclusions (a webhook that times out is skipped:
# no patch at all).
FAILING_LOOKUP_TIMEOUT: Final = 0.5
# Less than this left of it after the first LIST: the second is not tried.
MIN_LOOKUP_TIMEOUT: Final = 0.05
# Nodes carrying the moved-off mark read in one LIST to find a fresh one: the marks of a burst
# are a handful, and expired ones are removed by assess-nodes' review. Where it is not deployed
# they linger, and past this many a fresh mark may be missed: the preference is then left out,
# as when the API cannot answer.
MOVED_OFF_LOOKUP_LIMIT: Final = 50


def review_response(uid: str, mutation: Mutation | JobMutation | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if mutation is not None and mutation.changed:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(mutation.patch_json()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


class Admitter:
    def __init__(
        self,
        api: Callable[[], kube.Kube],
        cfg: Config,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        # The client is made on first use, inside the error handling: missing credentials
        # must not stop pods from being created.
        self._make_api = api
        self._api: kube.Kube | None = None
        self.cfg = cfg
        # Wall time: the moved-off marks are Unix seconds written by another function.
        self.clock = clock
        # namespace -> (monotonic expiry, its labels)
        self._namespaces: dict[str, tuple[float, dict[str, str]]] = {}

    @property
    def api(self) -> kube.Kube:
        if self._api is None:
            # One attempt with a short timeout: the API server waits for us, the pod waits.
            made = self._make_api().with_options(timeout=self.cfg.api_timeout_seconds)
            made.attempts = 1
            self._api = made
        return self._api

    def review(self, body: object) -> dict[str, Any]:
        """Answer an AdmissionReview. Raises ValueError only when the body has no request uid
        (there is nothing valid to answer then)."""
        if not isinstance(body, dict) or not isinstance(body.get("request"), dict):
            raise ValueError("not an AdmissionReview")
        request = body["request"]
        uid = request.get("uid")
        if not isinstance(uid, str) or not uid:
            raise ValueError("AdmissionReview without request.uid")
        try:
            mutation = self.decide(request)
        except Exception as exc:  # never block a pod: allow without a patch and say why
            log.warning("admitting pod unchanged after an error: %s", exc, exc_info=True)
            metrics.WEBHOOK.labels(result="error").inc()
            return review_response(uid)
        metrics.WEBHOOK.labels(
            result="patched" if mutation and mutation.changed else "unchanged"
        ).inc()
        return review_response(uid, mutation)

    def decide(self, request: Mapping[str, Any]) -> Mutation | JobMutation | None:
        if request.get("operation") != "CREATE":
            return None
        kind = request.get("kind") or {}
        if kind.get("group") == "batch" and kind.get("kind") == "Job":
            return self.decide_job(request)
        if kind.get("kind") != "Pod":
            return None
        namespace = request.get("namespace") or ""
        if self.cfg.is_excluded_namespace(namespace):
            return None
        raw = request.get("object")
        if not isinstance(raw, dict) or not isinstance(raw.get("metadata"), dict):
            # The API server always sends the pod; only a hand-made review lacks it, and a
            # patch computed for an empty pod would not apply to what was sent.
            return None
        pod: Pod = raw  # type: ignore[assignment]
        meta = pod["metadata"]
        resolution = resolve(self.api, namespace, pod)
        if resolution.holder is None:
            return None
        holder = resolution.holder
        excluded: tuple[str, ...] = ()
        if resolution.policy is not None:
            excluded = self._exclusions(holder, resolution.owner_kind, meta.get("name"))
        facts = OwnerFacts(
            policy=resolution.policy,
            excluded_nodes=excluded,
            kse_compat=self.cfg.kse_compat,
            stuck_after=holder.annotations.get(STUCK_AFTER_ANNOTATION),
            max_retries=self.cfg.max_retries,
            avoid=self._avoid(resolution.policy, holder, namespace, excluded),
        )
        # Also for pods that did not opt in: stamps and the opted-in label copied from a
        # template or another pod are removed, so such a pod never looks opted in to
        # detect-failures, and its events are not even sent.
        mutation = mutate(pod, facts)
        if resolution.policy is not None or mutation.changed:
            log.info(
                "admitted pod",
                extra={
                    "pod": f"{namespace}/{meta.get('name') or meta.get('generateName', '')}",
                    "owner": holder.ref.describe(),
                    "reasons": list(mutation.reasons),
                },
            )
        return mutation

    def _avoid(
        self, policy: str | None, holder: Holder, namespace: str, excluded: tuple[str, ...] = ()
    ) -> tuple[SoftAvoid, ...]:
        """The soft affinities this pod gets: away from suspect nodes for a pod whose policy
        allows moves; away from nodes where other workloads fail now, or that a pod was moved
        off within ``moved_off_window``, for such a pod placed after a move (it has exclusions)
        while such a node exists; away from nodes under pressure for those, and for pods whose
        workload (annotation) or namespace (label) says
        ``kn-rescheduler.io/avoid-pressure: "true"``."""
        retries = parse_retries(policy, self.cfg.max_retries)
        moves = isinstance(retries, int) and retries > 0
        avoid: list[SoftAvoid] = []
        if moves and self.cfg.suspect_affinity_weight:
            avoid.append(
                SoftAvoid(SUSPECT_LABEL, SUSPECT_VALUE, self.cfg.suspect_affinity_weight, "suspect")
            )
        weight = self.cfg.failing_affinity_weight
        now = self.clock()
        window = self.cfg.moved_off_window
        if moves and excluded and weight and self._failing_elsewhere(excluded, now):
            # Always the two-term form, marks or not: on a cluster without marks it scores
            # every node as the failing-workloads term alone would, and a mark written after
            # this admission is read by the scheduler, not by us.
            avoid.append(
                SoftAvoid(
                    FAILING_WORKLOADS_LABEL,
                    "",
                    weight,
                    "failing for other workloads or moved off within " + format_duration(window),
                    any_value=True,
                    moved_off_before=movedoff.steers_before(now, window),
                )
            )
        if self.cfg.pressure_affinity_weight and (
            moves
            or holder.annotations.get(AVOID_PRESSURE_KEY) == "true"
            or self._namespace_opts_in(namespace, AVOID_PRESSURE_KEY)
        ):
            key, _, value = self.cfg.pressure_label.partition("=")
            avoid.append(
                SoftAvoid(key, value, self.cfg.pressure_affinity_weight, f"labelled {key}={value}")
            )
        weight = self.cfg.load_affinity_weight
        if weight and (
            holder.annotations.get(LOAD_AWARE_KEY) == "true"
            or self._namespace_opts_in(namespace, LOAD_AWARE_KEY)
        ):
            # Two terms: low-load nodes score weight * 1.5, medium weight, high and overloaded
            # nothing; a node without the label (not measured, stale) scores as a low one.
            avoid.append(
                SoftAvoid(
                    LOAD_LABEL,
                    LOAD_HIGH,
                    weight,
                    "under high load or overloaded",
                    more_values=(LOAD_OVERLOADED,),
                )
            )
            avoid.append(
                SoftAvoid(
                    LOAD_LABEL,
                    LOAD_MEDIUM,
                    max(1, weight // 2),
                    "under medium load or more",
                    more_values=(LOAD_HIGH, LOAD_OVERLOADED),
                )
            )
        return tuple(avoid)

    def _failing_elsewhere(self, excluded: tuple[str, ...], now: datetime) -> bool:
        """Whether a node outside the pod's own exclusions carries the failing-workloads label
        or a fresh moved-off mark. Only then is the preference worth its cost (a term every
        other node matches dilutes the pod's own preferences: docs/node-health.md).

        First one LIST with a label and a field selector, at most one Node back; only when it
        finds none (in a burst the marks come first: assess-nodes' label takes seconds more), a
        second for the marked nodes, whose freshness is read here: a mark nobody removed (no
        assess-nodes) outlives its window. Both share one timeout. Unreadable: no (never block
        a pod)."""
        fields = ",".join(f"{NODE_NAME_FIELD}!={name}" for name in excluded)
        budget = min(self.cfg.api_timeout_seconds, FAILING_LOOKUP_TIMEOUT)
        started = time.monotonic()
        try:
            page = self.api.with_options(timeout=budget).list_page(
                "Node", limit=1, label_selector=FAILING_WORKLOADS_LABEL, field_selector=fields
            )
            if page.get("items"):
                return True
            if not self.cfg.moved_off_mark:
                return False
            left = budget - (time.monotonic() - started)
            if left < MIN_LOOKUP_TIMEOUT:
                log.info("no time left to list the nodes pods were moved off")
                return False
            page = self.api.with_options(timeout=left).list_page(
                "Node",
                limit=MOVED_OFF_LOOKUP_LIMIT,
                label_selector=MOVED_OFF_LABEL,
                field_selector=fields,
            )
        except kube.KubeError as exc:
            log.info("cannot list the nodes where workloads fail or pods were moved off: %s", exc)
            return False
        window = self.cfg.moved_off_window
        return any(
            movedoff.fresh((node.get("metadata") or {}).get("labels"), now, window)
            for node in page.get("items") or []
        )

    def _namespace_opts_in(self, namespace: str, key: str) -> bool:
        """Whether the namespace carries the label ``key: "true"``; its labels are read at
        most every NAMESPACE_TTL seconds per namespace (every pod create comes here).
        Unreadable: no (never block a pod)."""
        now = time.monotonic()
        cached = self._namespaces.get(namespace)
        if cached is not None and cached[0] > now:
            return cached[1].get(key) == "true"
        try:
            found = self.api.get("Namespace", None, namespace)
        except kube.KubeError as exc:
            log.info("cannot read namespace %s for its opt-in labels: %s", namespace, exc)
            labels: dict[str, str] = {}
        else:
            labels = dict((found.get("metadata") or {}).get("labels") or {})
        if len(self._namespaces) > NAMESPACE_CACHE_MAX:
            self._namespaces.clear()
        self._namespaces[namespace] = (now + NAMESPACE_TTL, labels)
        return labels.get(key) == "true"

    def decide_job(self, request: Mapping[str, Any]) -> JobMutation | None:
        """A Job being created: the Ignore DisruptionTarget rule, when asked and opted in."""
        namespace = request.get("namespace") or ""
        if self.cfg.is_excluded_namespace(namespace):
            return None
        raw = request.get("object")
        if not isinstance(raw, dict) or not isinstance(raw.get("metadata"), dict):
            return None
        job: Job = raw  # type: ignore[assignment]
        meta = job["metadata"]
        annotations = dict(meta.get("annotations") or {})
        wanted = (POLICY_ANNOTATION, IGNORE_DISRUPTIONS_ANNOTATION)
        owner = controller_of(job)  # type: ignore[arg-type]
        from_cron = owner is not None and owner.get("kind") == "CronJob" and owner.get("name")
        if from_cron and any(key not in annotations for key in wanted):
            # The jobTemplate's annotations are on the Job already; the CronJob's own are not,
            # and fill in what the Job lacks.
            assert owner is not None
            cron = self.api.get("CronJob", namespace, str(owner["name"]))
            for key, value in ((cron.get("metadata") or {}).get("annotations") or {}).items():
                if key in wanted:
                    annotations.setdefault(key, value)
        asked = annotations.get(IGNORE_DISRUPTIONS_ANNOTATION, "").strip().lower() == "true"
        if not asked:
            return JobMutation(reasons=("not asked",), job=job)
        retries = parse_retries(annotations.get(POLICY_ANNOTATION), self.cfg.max_retries)
        mutation = ignore_disruptions(
            job, opted_in=isinstance(retries, int) and retries > 0, asked=True
        )
        log.info(
            "admitted job",
            extra={
                "job": f"{namespace}/{meta.get('name') or meta.get('generateName', '')}",
                "reasons": list(mutation.reasons),
            },
        )
        return mutation

    def _exclusions(self, holder: Holder, owner_kind: str, pod_name: str | None) -> tuple[str, ...]:
        """The owner's recorded exclusions for this pod, without names Kubernetes would refuse
        (a hand-edited state, or a tenant's own bare-pod state): those are skipped and logged,
        the valid ones kept. An unreadable state, or another object's copy, gives none."""
        try:
            loaded = load_state_lenient(holder.annotations.get(STATE_ANNOTATION))
        except StateError as exc:
            log.warning("%s: unreadable state, no exclusions: %s", holder.ref.describe(), exc)
            return ()
        copied = foreign_copy(loaded.state, owner_kind, holder.ref.uid)
        if copied is not None:
            log.info("%s: no exclusions: %s", holder.ref.describe(), copied)
            return ()
        if loaded.skipped_nodes:
            log.warning(
                "%s: state lists %d invalid node name(s), skipped: %s",
                holder.ref.describe(),
                len(loaded.skipped_nodes),
                ", ".join(repr(name[:64]) for name in loaded.skipped_nodes[:5]),
            )
        return exclusions_for(loaded.state, OwnerKind(owner_kind), pod_name)
