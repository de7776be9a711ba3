"""What mutate-admission changes on a new pod: the policy stamp and the nodes to avoid.

The webhook copies the owner's policy and recorded exclusions onto the pod (so detect-failures
can judge the pod without API access) and adds a required node affinity that keeps the
scheduler off the excluded nodes, merged into whatever affinity the pod already has. It also
copies the owner's `kn-rescheduler.io/stuck-after`, so the sweep can judge the pod alone.

The stamps are ours (`kn-rescheduler.io/...`), never the user's `scheduling-retries`: an owner
without a policy gets stale stamps removed, and a policy of 0 (or one we cannot read) is
stamped but excludes no node, so turning rescheduling off also stops the recorded exclusions.

With the policy stamp goes the label `kn-rescheduler.io/opted-in: "true"`, which the
ApiServerSource selects on: the API server then sends the pipeline no event for a pod that
never opted in. The label follows the policy stamp exactly (set with it, removed with it), so
every pod that could ever matter to detect-failures carries it: one that opted in, one with a
policy of 0 or an unreadable one (detect-failures warns about those), and every pod our
exclusions could keep Pending (exclusions are only stamped together with a policy).

The API server applies the JSON Patch we return after our webhook answered, and
`failurePolicy: Ignore` does not cover a patch that fails to apply: a wrong patch rejects the
pod. So the patch is never written by hand: we change a deep copy and let `jsonpatch` diff the
two, which also keeps the patch minimal (`add` on `/metadata/annotations` replaces the whole
map when it exists, so a hand-written one would drop the user's annotations). For the same
reason nothing we write may be invalid: every excluded node must be a valid node name (one
value per NotIn, as the API requires for node field selectors), and our stamps must not take
the pod's annotations past the API's size limit.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, cast

import jsonpatch

from shared.api.keys import (
    EXCLUDED_NODES_ANNOTATION,
    FAILING_WORKLOADS_LABEL,
    KSE_SCHEDULED_HOSTS_ANNOTATION,
    MOVED_OFF_LABEL,
    NODE_NAME_FIELD,
    OPT_OUT_LABEL,
    OPTED_IN_LABEL,
    OPTED_IN_VALUE,
    POLICY_ANNOTATION,
    POLICY_STAMP_ANNOTATION,
    STUCK_AFTER_ANNOTATION,
)
from shared.api.kubetypes import (
    Affinity,
    NodeAffinity,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Pod,
    PodSpec,
    PreferredSchedulingTerm,
)
from shared.api.state import is_valid_node_name
from shared.platform.config import MAX_RETRIES
from shared.workloads.policy import (
    parse_retries,
)
from shared.workloads.state import MAX_EXCLUDED_NODES

# The API server refuses an object whose annotation keys and values add up to more than this
# (apimachinery's TotalAnnotationSizeLimitB), and failurePolicy Ignore does not save the pod.
ANNOTATIONS_SIZE_LIMIT: Final = 256 * 1024
# Owner values we copy onto the pod are cut (the policy) or left out (stuck-after) past this
# length: a valid value is a few characters, and a huge one must not push the pod's
# annotations past the API's limit. A policy cut this short stays invalid if it was invalid.
MAX_COPIED_VALUE: Final = 64


@dataclass(frozen=True)
class OwnerFacts:
    """What the webhook learned from the pod's owner (or, for a bare pod, the pod itself)."""

    # The owner's raw scheduling-retries value, stamped as is (detect-failures parses it and
    # warns about bad values); None when the owner has no policy.
    policy: str | None
    # The nodes this pod must avoid: `state.exclusions_for(...)` of the owner's state. Only
    # applied while the policy allows moves (a whole number from 1 to `max_retries`).
    excluded_nodes: tuple[str, ...] = ()
    # Also write kse.com/scheduled-hosts for the original Podrescheduling scheduler plugin.
    kse_compat: bool = False
    # The owner's kn-rescheduler.io/stuck-after, copied verbatim for the sweep; None if unset.
    stuck_after: str | None = None
    max_retries: int = MAX_RETRIES
    # Preferred node affinities away from nodes carrying a label (suspect, under pressure).
    avoid: tuple[SoftAvoid, ...] = ()


@dataclass(frozen=True)
class SoftAvoid:
    """A preferred node affinity away from nodes labelled ``key=value``: the scheduler scores
    those nodes ``weight`` lower, and still uses them when nothing else fits."""

    key: str
    value: str
    weight: int
    what: str  # for the reasons: "suspect nodes", "nodes under pressure"
    # More values to avoid with the same term (load buckets: high and overloaded).
    more_values: tuple[str, ...] = ()
    # Avoid every node carrying the key, whatever its value (a count: failing workloads).
    any_value: bool = False
    # With any_value: also avoid nodes carrying the moved-off mark from this second on (whole
    # Unix seconds, `movedoff.steers_before`); None: the key alone. See `terms`.
    moved_off_before: str | None = None

    def terms(self) -> tuple[PreferredSchedulingTerm, ...]:
        """The preferred terms the pod gets for this: one, or two for the moved-off form."""
        if self.any_value and self.moved_off_before is not None:
            # "No key, and no mark or an old one": expressions within a term are ANDed, terms
            # are not ORed but each adds its weight, so the OR is two terms no node matches
            # both of (a node has the mark or not). Lt compares the label as an integer and
            # matches nothing that is not one, so a value not ours scores like a fresh mark.
            return (
                {
                    "weight": self.weight,
                    "preference": {
                        "matchExpressions": [
                            {"key": self.key, "operator": "DoesNotExist"},
                            {"key": MOVED_OFF_LABEL, "operator": "DoesNotExist"},
                        ]
                    },
                },
                {
                    "weight": self.weight,
                    "preference": {
                        "matchExpressions": [
                            {"key": self.key, "operator": "DoesNotExist"},
                            {
                                "key": MOVED_OFF_LABEL,
                                "operator": "Lt",
                                "values": [self.moved_off_before],
                            },
                        ]
                    },
                },
            )
        if self.any_value:
            return (
                {
                    "weight": self.weight,
                    "preference": {
                        "matchExpressions": [{"key": self.key, "operator": "DoesNotExist"}]
                    },
                },
            )
        # NotIn also matches nodes without the label at all: every healthy node scores, and a
        # node nobody measured is never ranked below a measured one.
        return (
            {
                "weight": self.weight,
                "preference": {
                    "matchExpressions": [
                        {
                            "key": self.key,
                            "operator": "NotIn",
                            "values": [self.value, *self.more_values],
                        }
                    ]
                },
            },
        )

    def term(self) -> PreferredSchedulingTerm:
        """The one term of a single-term preference (ValueError for the moved-off form)."""
        (only,) = self.terms()
        return only


@dataclass(frozen=True)
class Mutation:
    # RFC 6902 operations turning the submitted pod into `pod`; empty when nothing changes.
    patch: tuple[dict[str, Any], ...] = field(default=(), hash=False)
    reasons: tuple[str, ...] = ()
    # The pod as it will be created (for logs and tests).
    pod: Pod = field(default_factory=lambda: cast(Pod, {}), hash=False, compare=False)

    @property
    def changed(self) -> bool:
        return bool(self.patch)

    def patch_json(self) -> bytes:
        """The patch as the AdmissionResponse wants it (before base64)."""
        return json.dumps(list(self.patch), separators=(",", ":")).encode()


def node_exclusion_requirements(nodes: Iterable[str]) -> list[NodeSelectorRequirement]:
    """One `metadata.name NotIn [node]` requirement per node.

    Kubernetes validation allows exactly one value for In/NotIn in a node *field* selector
    ("must be only one value when `operator` is 'In' or 'NotIn' for node field selector"), so
    several nodes need several requirements; inside a term they are ANDed, which means the same.
    """
    return [{"key": NODE_NAME_FIELD, "operator": "NotIn", "values": [node]} for node in nodes]


_OUR_ANNOTATIONS: Final = (
    POLICY_STAMP_ANNOTATION,
    STUCK_AFTER_ANNOTATION,
    EXCLUDED_NODES_ANNOTATION,
    KSE_SCHEDULED_HOSTS_ANNOTATION,
    NODE_NAME_FIELD,
)


def _carries_our_marks(pod: Pod) -> bool:
    """Whether the pod carries a stamp or label of ours (copied from a template, say)."""
    meta = pod.get("metadata", {})
    annotations = meta.get("annotations") or {}
    return OPTED_IN_LABEL in (meta.get("labels") or {}) or any(
        key in annotations for key in _OUR_ANNOTATIONS
    )


def mutate(pod: Pod, owner: OwnerFacts) -> Mutation:
    """The patch that stamps the owner's policy and exclusions onto a pod being created.

    An owner without a policy gets stale stamps (copied from a template or another pod)
    removed, so the pod does not look opted in. With a policy of 0 (or one we cannot read)
    the policy is stamped, so detect-failures can tell, but no node is excluded. The
    `OPTED_IN_LABEL` goes and comes with the policy stamp.
    """
    labels = pod.get("metadata", {}).get("labels") or {}
    if OPT_OUT_LABEL in labels:
        return Mutation(reasons=(f"pod has the {OPT_OUT_LABEL} label",), pod=pod)
    if owner.policy is None and not owner.avoid and not _carries_our_marks(pod):
        # Most pods of a cluster: nothing to stamp, nothing stale to remove. Every pod create
        # comes here, so no copy and no diff for them.
        return Mutation(reasons=("not opted in",), pod=pod)
    changed = copy.deepcopy(pod)
    reasons: list[str] = []
    meta = changed.setdefault("metadata", {})
    annotations = dict(meta.get("annotations") or {})
    nodes = _nodes_to_exclude(owner, reasons)

    if owner.policy is None:
        _remove(annotations, POLICY_STAMP_ANNOTATION, reasons)
    else:
        _set(annotations, POLICY_STAMP_ANNOTATION, owner.policy[:MAX_COPIED_VALUE], reasons)
        if owner.stuck_after is None:
            _remove(annotations, STUCK_AFTER_ANNOTATION, reasons)
        elif len(owner.stuck_after) > MAX_COPIED_VALUE:
            reasons.append(f"owner's {STUCK_AFTER_ANNOTATION} is too long to be a duration")
            _remove(annotations, STUCK_AFTER_ANNOTATION, reasons)
        else:
            _set(annotations, STUCK_AFTER_ANNOTATION, owner.stuck_after, reasons)

    stamps = [EXCLUDED_NODES_ANNOTATION]
    if owner.kse_compat:
        stamps.append(KSE_SCHEDULED_HOSTS_ANNOTATION)
    for key in stamps:
        if nodes:
            _set(annotations, key, json.dumps(list(nodes), separators=(",", ":")), reasons)
        else:
            # Copied from a template or an older pod: it no longer matches the owner's state,
            # and a stale list would make an unschedulable pod look like our doing.
            _remove(annotations, key, reasons)

    if (
        _annotations_size(annotations)
        > ANNOTATIONS_SIZE_LIMIT
        >= _annotations_size(meta.get("annotations") or {})
    ):
        return Mutation(
            reasons=(
                f"our stamps would take the pod's annotations past the API's "
                f"{ANNOTATIONS_SIZE_LIMIT // 1024} KiB: pod left unchanged",
            ),
            pod=pod,
        )
    if annotations != (meta.get("annotations") or {}):
        meta["annotations"] = annotations

    # The label goes with the policy stamp, whatever the policy's value: the ApiServerSource
    # selects on it, so without it the pod's events never reach detect-failures.
    new_labels = dict(meta.get("labels") or {})
    if owner.policy is None:
        _remove(new_labels, OPTED_IN_LABEL, reasons)
    else:
        _set(new_labels, OPTED_IN_LABEL, OPTED_IN_VALUE, reasons)
    if new_labels != (meta.get("labels") or {}):
        meta["labels"] = new_labels

    if nodes:
        spec = changed.setdefault("spec", {})
        if spec.get("nodeName"):
            # Bound at creation, so the scheduler never runs; a required affinity excluding
            # that node would only make the kubelet reject the pod (NodeAffinity).
            reasons.append(f"pod is bound to node {spec['nodeName']}: affinity left alone")
        else:
            reasons.extend(_exclude_nodes(spec, nodes))

    if owner.avoid or (owner.excluded_nodes and _preferred_terms(changed)):
        # Also without a preference to add, for a pod placed after a move (the only kind that
        # ever got them): our earlier terms that age go (see _prefer_away). Any other pod's
        # terms are its author's, whatever they name.
        spec = changed.setdefault("spec", {})
        if not spec.get("nodeName"):
            reasons.extend(_prefer_away(spec, owner.avoid))

    patch = tuple(jsonpatch.make_patch(pod, changed).patch)
    if not patch:
        reasons.append("nothing to change")
    return Mutation(patch=patch, reasons=tuple(reasons), pod=changed)


def _nodes_to_exclude(owner: OwnerFacts, reasons: list[str]) -> tuple[str, ...]:
    """The owner's exclusions this pod may carry: none unless the policy allows moves, only
    names the API server accepts in a node field selector, each once, the most recent
    `MAX_EXCLUDED_NODES`."""
    if not owner.excluded_nodes:
        return ()
    retries = parse_retries(owner.policy, owner.max_retries)
    if not isinstance(retries, int) or retries == 0:
        # 0 turns rescheduling off, and a policy we cannot read is not a policy: either way
        # the recorded exclusions must not keep pods off nodes any more.
        why = "no policy" if retries is None else f"{POLICY_ANNOTATION}={owner.policy!r}"
        reasons.append(f"{why}: the owner's {len(owner.excluded_nodes)} excluded node(s) ignored")
        return ()
    invalid = [node for node in owner.excluded_nodes if not is_valid_node_name(node)]
    if invalid:
        # Defence in depth: states are checked when read, but one invalid name here would make
        # the API server refuse the pod, which failurePolicy Ignore does not cover.
        shown = ", ".join(repr(node[:MAX_COPIED_VALUE]) for node in invalid[:5])
        reasons.append(f"skipped {len(invalid)} invalid node name(s): {shown}")
    nodes = tuple(dict.fromkeys(n for n in owner.excluded_nodes if is_valid_node_name(n)))
    if len(nodes) > MAX_EXCLUDED_NODES:
        reasons.append(f"kept the {MAX_EXCLUDED_NODES} most recent of {len(nodes)} nodes")
        nodes = nodes[-MAX_EXCLUDED_NODES:]
    return nodes


def _set(values: dict[str, str], key: str, value: str, reasons: list[str]) -> None:
    """Set an annotation or label of ours."""
    if values.get(key) != value:
        values[key] = value
        reasons.append(f"stamped {key}={value}")


def _remove(values: dict[str, str], key: str, reasons: list[str]) -> None:
    """Remove an annotation or label of ours."""
    if key in values:
        del values[key]
        reasons.append(f"removed stale {key}")


def _annotations_size(annotations: Mapping[str, str]) -> int:
    # The API counts bytes of keys and values (Go's len of a string).
    return sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())


def _exclude_nodes(spec: PodSpec, nodes: tuple[str, ...]) -> list[str]:
    """Merge the exclusions into spec.affinity in place; return what was done."""
    ours = node_exclusion_requirements(nodes)
    affinity = cast(Affinity, spec.get("affinity") or {})
    node_affinity: NodeAffinity = affinity.get("nodeAffinity") or {}
    required: NodeSelector = (
        node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    )
    terms: list[NodeSelectorTerm] = list(required.get("nodeSelectorTerms") or [])

    if not terms:
        terms = [{"matchFields": ours}]
        done = [f"added a required node affinity avoiding {', '.join(nodes)}"]
    else:
        extended = 0
        for term in terms:
            # nodeSelectorTerms are ORed and an empty term matches no node; adding to it
            # would turn "nothing" into "everything but these nodes".
            if not term.get("matchExpressions") and not term.get("matchFields"):
                continue
            fields = list(term.get("matchFields") or [])
            missing = [req for req in ours if req not in fields]
            if missing:
                term["matchFields"] = fields + missing
                extended += 1
        if extended:
            done = [f"extended {extended} nodeSelectorTerm(s) to avoid {', '.join(nodes)}"]
        elif all(not t.get("matchExpressions") and not t.get("matchFields") for t in terms):
            return ["every nodeSelectorTerm is empty (matches no node): affinity left alone"]
        else:
            return ["node affinity already avoids the excluded nodes"]

    required["nodeSelectorTerms"] = terms
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
    affinity["nodeAffinity"] = node_affinity
    spec["affinity"] = dict(affinity)
    return done


def _preferred_terms(pod: Pod) -> list[PreferredSchedulingTerm]:
    affinity = cast(Affinity, (pod.get("spec") or {}).get("affinity") or {})
    node_affinity: NodeAffinity = affinity.get("nodeAffinity") or {}
    return list(node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or [])


# The term the preference away from failing nodes was before the moved-off mark joined it.
_EARLIER_FAILING_TERM: Final = [{"key": FAILING_WORKLOADS_LABEL, "operator": "DoesNotExist"}]


def _ours_that_ages(term: PreferredSchedulingTerm) -> bool:
    """Whether a preferred term is our preference away from failing or moved-off nodes, from an
    earlier admission: a bare pod's replacement is created with the failed pod's spec, affinity
    and all. Its Lt operand was that admission's time, so kept it would steer off nodes whose
    marks have long expired, and each move would add two more terms. The earlier single-term
    form counts too; nobody else's term names the moved-off label."""
    preference = term.get("preference") or {}
    expressions = preference.get("matchExpressions") or []
    if expressions == _EARLIER_FAILING_TERM and not preference.get("matchFields"):
        return True
    return any(
        isinstance(expression, dict) and expression.get("key") == MOVED_OFF_LABEL
        for expression in expressions
    )


def _prefer_away(spec: PodSpec, avoid: tuple[SoftAvoid, ...]) -> list[str]:
    """Add each preferred term the pod does not have yet (a manifest written for the seed
    already says `status NotIn [presure]`: not added twice), after removing our earlier terms
    that age unless they are exactly what would be added now; the user's terms stay as they
    are. Return what was done."""
    affinity = cast(Affinity, spec.get("affinity") or {})
    node_affinity: NodeAffinity = affinity.get("nodeAffinity") or {}
    before = list(node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or [])
    wanted = [term for soft in avoid for term in soft.terms()]
    preferred: list[PreferredSchedulingTerm] = []
    for term in before:
        if not _ours_that_ages(term) or (term in wanted and term not in preferred):
            preferred.append(term)
    done: list[str] = []
    if len(preferred) < len(before):
        done.append(f"removed {len(before) - len(preferred)} earlier preference term(s) of ours")
    have = [term.get("preference") for term in preferred]
    for soft in avoid:
        added = [term for term in soft.terms() if term["preference"] not in have]
        if added:
            preferred.extend(added)
            have.extend(term["preference"] for term in added)
            done.append(f"prefers nodes that are not {soft.what} (weight {soft.weight})")
    if preferred == before:
        return done
    if preferred:
        node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] = preferred
    else:
        node_affinity.pop("preferredDuringSchedulingIgnoredDuringExecution", None)
    if node_affinity:
        affinity["nodeAffinity"] = node_affinity
    else:
        affinity.pop("nodeAffinity", None)
    if affinity:
        spec["affinity"] = dict(affinity)
    else:
        spec.pop("affinity", None)
    return done
