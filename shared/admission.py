"""What mutate-admission changes on a new pod: the policy stamp and the nodes to avoid.

The webhook copies the owner's policy and recorded exclusions onto the pod (so detect-failures
can judge the pod without API access) and adds a required node affinity that keeps the
scheduler off the excluded nodes, merged into whatever affinity the pod already has.

The API server applies the JSON Patch we return after our webhook answered, and
`failurePolicy: Ignore` does not cover a patch that fails to apply: a wrong patch rejects the
pod. So the patch is never written by hand: we change a deep copy and let `jsonpatch` diff the
two, which also keeps the patch minimal (`add` on `/metadata/annotations` replaces the whole
map when it exists, so a hand-written one would drop the user's annotations).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final, cast

import jsonpatch

from shared.constants import (
    EXCLUDED_NODES_ANNOTATION,
    KSE_SCHEDULED_HOSTS_ANNOTATION,
    OPT_OUT_LABEL,
    POLICY_STAMP_ANNOTATION,
)
from shared.kubetypes import (
    Affinity,
    NodeAffinity,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Pod,
    PodSpec,
)

# The only field a node selector can match on.
NODE_NAME_FIELD: Final = "metadata.name"


@dataclass(frozen=True)
class OwnerFacts:
    """What the webhook learned from the pod's owner (or, for a bare pod, the pod itself)."""

    # The owner's raw scheduling-retries value, stamped as is (detect-failures parses it and
    # warns about bad values); None when the owner has no policy.
    policy: str | None
    # The nodes this pod must avoid: `state.exclusions_for(...)` of the owner's state.
    excluded_nodes: tuple[str, ...] = ()
    # Also write kse.com/scheduled-hosts for the original Podrescheduling scheduler plugin.
    kse_compat: bool = False


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


def mutate(pod: Pod, owner: OwnerFacts) -> Mutation:
    """The patch that stamps the owner's policy and exclusions onto a pod being created."""
    labels = pod.get("metadata", {}).get("labels") or {}
    if OPT_OUT_LABEL in labels:
        return Mutation(reasons=(f"pod has the {OPT_OUT_LABEL} label",), pod=pod)
    changed = copy.deepcopy(pod)
    reasons: list[str] = []
    meta = changed.setdefault("metadata", {})
    annotations = dict(meta.get("annotations") or {})
    nodes = tuple(dict.fromkeys(node for node in owner.excluded_nodes if node))

    if owner.policy is not None and annotations.get(POLICY_STAMP_ANNOTATION) != owner.policy:
        annotations[POLICY_STAMP_ANNOTATION] = owner.policy
        reasons.append(f"stamped {POLICY_STAMP_ANNOTATION}={owner.policy}")

    stamps = [EXCLUDED_NODES_ANNOTATION]
    if owner.kse_compat:
        stamps.append(KSE_SCHEDULED_HOSTS_ANNOTATION)
    for key in stamps:
        if nodes:
            value = json.dumps(list(nodes), separators=(",", ":"))
            if annotations.get(key) != value:
                annotations[key] = value
                reasons.append(f"stamped {key}={value}")
        elif key in annotations:
            # Copied from a template or an older pod: it no longer matches the owner's state,
            # and a stale list would make an unschedulable pod look like our doing.
            del annotations[key]
            reasons.append(f"removed stale {key}")

    if annotations != (meta.get("annotations") or {}):
        meta["annotations"] = annotations

    if nodes:
        spec = changed.setdefault("spec", {})
        if spec.get("nodeName"):
            # Bound at creation, so the scheduler never runs; a required affinity excluding
            # that node would only make the kubelet reject the pod (NodeAffinity).
            reasons.append(f"pod is bound to node {spec['nodeName']}: affinity left alone")
        else:
            reasons.extend(_exclude_nodes(spec, nodes))

    patch = tuple(jsonpatch.make_patch(pod, changed).patch)
    if not patch:
        reasons.append("nothing to change")
    return Mutation(patch=patch, reasons=tuple(reasons), pod=changed)


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
