"""The MutatingAdmissionPolicies that do mutate-admission's work inside the API server.

On Kubernetes 1.36 (MutatingAdmissionPolicy GA; beta behind a gate in 1.34-1.35) the API server
can apply CEL mutations itself: no network hop, no certificate, nothing to be down while pods
are created. A policy sees the pod being created, the request, its namespace and *params*, but
never looks anything up, so the webhook's one lookup (the pod's owner) becomes a param:

- One policy per owner kind we follow (ReplicaSet, StatefulSet, Job), whose ``paramKind`` is that
  kind and whose binding selects the objects of it in the pod's namespace that carry
  ``kn-rescheduler.io/admission-param``. The API server evaluates a policy once per selected
  param, converting the pod and the param each time (0.1 to 0.15 ms here: dev/bench/RESULTS.md),
  so the selection is kept to the workloads a pod's admission reads: ``holder_policy`` labels a
  workload at its create and updates while it has an annotation of ours and may make pods. The
  first match condition keeps only the param that is the pod's controller (same uid); the params
  come from the API server's own informer: no request leaves it.
- A Deployment's policy is on its ReplicaSets too: the Deployment controller copies the
  Deployment's annotations onto the newest one on every sync
  (``copyDeploymentAnnotationsToReplicaSet``), as the webhook reads them.
- A bare pod is its own param (a policy without ``paramKind``): a bare pod's policy and state are
  its own annotations. A namespace's own preferences come from policies without params that
  select the namespaces asking (a match condition cannot read the namespace).
- The state is JSON, and CEL has no JSON decoder, so update-annotations writes the exclusions a
  second time beside it, flat (``shared.api.avoidnodes``), prefixed with the holder's uid: a copy
  on another object (``kubectl rollout undo`` copies annotations both ways) does not apply.
- Each pod policy is one JSON Patch: every mutation costs an encode and a decode of the pod,
  and an ApplyConfiguration may not touch the atomic node affinity fields at all.

Every mutation here is built as data and rendered to YAML by ``python -m dev.tools.policies``;
tests/unit/test_admission_policies.py checks that the file under
knative/components/admission-policies/ is what this module renders, and the e2e tests run the
same objects on the local 1.36 control plane.

The guarantees are the webhook's:

- Never block pod creation: ``failurePolicy: Ignore``; an expression that fails (a malformed
  annotation, say) is skipped. What failurePolicy does *not* cover is a mutated pod the API
  server then refuses, so no value reaches the pod unchecked: node names must be DNS-1123
  subdomains (or none is used), at most ``MAX_EXCLUDED_NODES``, the copied policy and
  stuck-after are cut to ``MAX_COPIED_VALUE``.
- Never write outside our keys: labels and annotations are added and removed one key of ours
  at a time. The required node affinity is rewritten whole, from the pod's own terms plus ours: a
  term the pod has gets our requirements added (an empty term, which matches no node, is left
  empty); preferred terms are appended one by one, a term the pod already has not twice.
- Survive a missing or malformed param: no param means no evaluation; a flat list that does not
  parse, names another object's uid, or names an invalid node gives no exclusion at all.

What the webhook does that a policy cannot, and what replaces it, is in docs/install-choices.md
("Admission: webhook or policies").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from shared.admission.decide import ANNOTATIONS_SIZE_LIMIT, MAX_COPIED_VALUE
from shared.api.avoidnodes import ANNOTATION as AVOID_NODES_ANNOTATION
from shared.api.avoidnodes import ANY_POD, SEPARATOR
from shared.api.keys import (
    ADMISSION_PARAM_LABEL,
    ADMISSION_PARAM_VALUE,
    AVOID_PRESSURE_KEY,
    EXCLUDED_NODES_ANNOTATION,
    FAILING_WORKLOADS_LABEL,
    IGNORE_DISRUPTIONS_ANNOTATION,
    LOAD_AWARE_KEY,
    LOAD_HIGH,
    LOAD_LABEL,
    LOAD_MEDIUM,
    LOAD_OVERLOADED,
    MOVED_OFF_LABEL,
    NODE_NAME_FIELD,
    OPT_OUT_LABEL,
    OPTED_IN_LABEL,
    OPTED_IN_VALUE,
    POLICY_ANNOTATION,
    POLICY_STAMP_ANNOTATION,
    STUCK_AFTER_ANNOTATION,
    SUSPECT_LABEL,
    SUSPECT_VALUE,
)
from shared.platform.config import Config
from shared.workloads.state import MAX_EXCLUDED_NODES

API_VERSION: Final = "admissionregistration.k8s.io/v1"
# Names of the objects we install; every one starts with this.
NAME_PREFIX: Final = "kn-rescheduler-"
# The label every installed policy and binding carries (the uninstall and the tests find them).
PART_OF: Final = {"app.kubernetes.io/part-of": "kn-rescheduler"}

# Node names as ValidateNodeName accepts them (DNS-1123 subdomain), for the CEL `matches`.
# (`[.]` rather than an escaped dot: no backslash to get through YAML and CEL quoting.)
_NODE_NAME_RE: Final = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_MAX_NODE_NAME: Final = 253


@dataclass(frozen=True)
class OwnerKind:
    """A controller kind a policy follows: the pods it creates get that kind's policy."""

    name: str  # the policy's name suffix
    api_version: str
    kind: str
    # Each pod of a StatefulSet has its own exclusions (by pod name); the others share one list.
    per_pod: bool = False


REPLICA_SET: Final = OwnerKind("replicaset", "apps/v1", "ReplicaSet")
STATEFUL_SET: Final = OwnerKind("statefulset", "apps/v1", "StatefulSet", per_pod=True)
JOB: Final = OwnerKind("job", "batch/v1", "Job")
OWNER_KINDS: Final = (REPLICA_SET, STATEFUL_SET, JOB)


def _quote(value: str) -> str:
    """A CEL string literal (single quotes; our keys have no quote or backslash)."""
    if "'" in value or "\\" in value:
        raise ValueError(f"cannot quote {value!r}")
    return f"'{value}'"


def _obj(type_name: str, **fields: str) -> str:
    """A CEL object initializer, ``Type{field: value, ...}`` (values are CEL already)."""
    return type_name + "{" + ", ".join(f"{k}: {v}" for k, v in fields.items()) + "}"


def _escape_pointer(key: str) -> str:
    """A map key as a JSON Pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def _pod_variables(holder: str, kind: OwnerKind | None, max_retries: int) -> list[dict[str, str]]:
    """What every pod policy computes before it mutates; ``holder`` is the CEL name of the
    object carrying the policy and state (``params``, or ``object`` for a bare pod)."""
    scope = (
        "object.metadata.?name.orValue('')"
        if kind is not None and kind.per_pod
        else _quote(ANY_POD)
    )
    # A bare pod's uid is not assigned until after admission: its own annotations need no
    # check that they are its own.
    uid_ok = "true" if kind is None else "variables.flat[0] == string(params.metadata.uid)"
    return [
        {"name": "annotations", "expression": f"{holder}.metadata.?annotations.orValue({{}})"},
        {
            "name": "hasPolicy",
            "expression": f"{_quote(POLICY_ANNOTATION)} in variables.annotations",
        },
        {
            "name": "policy",
            "expression": f"variables.annotations[?{_quote(POLICY_ANNOTATION)}].orValue('')",
        },
        {
            # parse_retries: digits only, at most `max_retries`; leading zeros are allowed.
            "name": "retries",
            "expression": (
                "variables.policy.matches('^0*[0-9]{1,6}$') ? int(variables.policy) : -1"
            ),
        },
        {
            "name": "moves",
            "expression": f"variables.retries >= 1 && variables.retries <= {max_retries}",
        },
        {
            "name": "flat",
            "expression": (
                f"variables.annotations[?{_quote(AVOID_NODES_ANNOTATION)}].orValue('')"
                f".split({_quote(SEPARATOR)})"
            ),
        },
        {
            "name": "entries",
            "expression": (
                # The form render writes, or nothing: every field after the uid a scope.
                f"size(variables.flat) >= 2 && {uid_ok} && "
                "variables.flat.all(e, e == variables.flat[0] || e.contains('=')) ? "
                f"variables.flat.filter(e, e.startsWith({scope} + '=')) : []"
            ),
        },
        {
            "name": "listed",
            "expression": (
                "size(variables.entries) == 1 ? "
                f"variables.entries[0].substring(size({scope}) + 1).split(',') : []"
            ),
        },
        {
            # All or nothing: one name the API server would refuse makes the pod unadmittable,
            # which failurePolicy does not cover; a name twice is not a list we wrote.
            "name": "excluded",
            "expression": (
                f"variables.moves && size(variables.listed) <= {MAX_EXCLUDED_NODES} && "
                "variables.listed.all(n, variables.listed.exists_one(m, m == n)) && "
                f"variables.listed.all(n, size(n) <= {_MAX_NODE_NAME} && "
                f"n.matches({_quote(_NODE_NAME_RE)})) ? variables.listed : []"
            ),
        },
        {
            "name": "bound",
            "expression": "object.spec.?nodeName.orValue('') != ''",
        },
        {
            "name": "stuckAfter",
            "expression": (f"variables.annotations[?{_quote(STUCK_AFTER_ANNOTATION)}].orValue('')"),
        },
        {"name": "labels", "expression": "object.metadata.?labels.orValue({})"},
        {
            "name": "podAnnotations",
            "expression": "object.metadata.?annotations.orValue({})",
        },
        {
            "name": "preferred",
            "expression": (
                "object.spec.?affinity.?nodeAffinity"
                ".?preferredDuringSchedulingIgnoredDuringExecution.orValue([])"
            ),
        },
    ]


_TERM_TYPE: Final = (
    "Object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    ".nodeSelectorTerms"
)
_PREF_TYPE: Final = (
    "Object.spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution"
)


def _json_patch(expression: str) -> dict[str, Any]:
    return {"patchType": "JSONPatch", "jsonPatch": {"expression": expression}}


@dataclass(frozen=True)
class _Soft:
    """One preferred term: the condition under which the pod gets it, the term as CEL."""

    when: str
    weight: int
    expressions: tuple[tuple[str, str, tuple[str, ...]], ...]  # (key, operator, values)


def _soft_terms(cfg: Config, *, namespace: bool = False, only: str | None = None) -> list[_Soft]:
    """The webhook's preferences (`Admitter._avoid`), as far as a policy can tell them apart:
    those the owner decides (``namespace`` False: the pod policies, whose param is the owner),
    or those the namespace asks for with a label (True: the namespace policy, which needs no
    param, so that pods of owners without one of our annotations get them too)."""
    if namespace:
        # The policy's namespaceSelector has chosen the namespaces that ask.
        pressure = "true" if only == AVOID_PRESSURE_KEY else "false"
        load = "true" if only == LOAD_AWARE_KEY else "false"
    else:
        pressure = (
            f"variables.moves || variables.annotations[?{_quote(AVOID_PRESSURE_KEY)}]"
            ".orValue('') == 'true'"
        )
        load = f"variables.annotations[?{_quote(LOAD_AWARE_KEY)}].orValue('') == 'true'"
    soft: list[_Soft] = []
    if cfg.suspect_affinity_weight and not namespace:
        soft.append(
            _Soft(
                "variables.moves",
                cfg.suspect_affinity_weight,
                ((SUSPECT_LABEL, "NotIn", (SUSPECT_VALUE,)),),
            )
        )
    if cfg.failing_affinity_weight and not namespace:
        # The webhook adds this only while such a node exists (a Node LIST) and writes the
        # moved-off window's start as an `Lt` operand (the clock); a policy has neither, so
        # every pod placed after a move gets it, and a mark counts until assess-nodes' review
        # removes it (docs/install-choices.md).
        soft.append(
            _Soft(
                "variables.moves && size(variables.excluded) > 0",
                cfg.failing_affinity_weight,
                (
                    (FAILING_WORKLOADS_LABEL, "DoesNotExist", ()),
                    (MOVED_OFF_LABEL, "DoesNotExist", ()),
                )
                if cfg.moved_off_mark
                else ((FAILING_WORKLOADS_LABEL, "DoesNotExist", ()),),
            )
        )
    if cfg.pressure_affinity_weight and pressure != "false":
        key, _, value = cfg.pressure_label.partition("=")
        soft.append(_Soft(pressure, cfg.pressure_affinity_weight, ((key, "NotIn", (value,)),)))
    if cfg.load_affinity_weight and load != "false":
        weight = cfg.load_affinity_weight
        soft.append(_Soft(load, weight, ((LOAD_LABEL, "NotIn", (LOAD_HIGH, LOAD_OVERLOADED)),)))
        soft.append(
            _Soft(
                load,
                max(1, weight // 2),
                ((LOAD_LABEL, "NotIn", (LOAD_MEDIUM, LOAD_HIGH, LOAD_OVERLOADED)),),
            )
        )
    return soft


def _list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(_quote(v) for v in values) + "]"


def _preferred(
    cfg: Config, *, namespace: bool = False, only: str | None = None
) -> tuple[str, str] | None:
    """CEL: which preferred terms the pod gets (a variable: a list of indexes, each when its
    condition holds and the pod lacks that term), and the terms themselves for those indexes
    (in the mutation: only a mutation may build ``Object`` values). None when every weight
    is 0."""
    wanted, built = [], []
    for index, soft in enumerate(_soft_terms(cfg, namespace=namespace, only=only)):
        expressions = ", ".join(
            f"{_PREF_TYPE}.preference.matchExpressions{{key: {_quote(key)}, "
            f"operator: {_quote(op)}" + (f", values: {_list(values)}" if values else "") + "}"
            for key, op, values in soft.expressions
        )
        # Already there (a manifest written with it, or a bare pod's replacement): not twice.
        same = " && ".join(
            [f"size(p.preference.?matchExpressions.orValue([])) == {len(soft.expressions)}"]
            + [
                f"p.preference.matchExpressions.exists(e, e.key == {_quote(key)} && "
                f"e.operator == {_quote(op)} && e.?values.orValue([]) == {_list(values)})"
                for key, op, values in soft.expressions
            ]
        )
        wanted.append(f"(({soft.when}) && !variables.preferred.exists(p, {same}) ? [{index}] : [])")
        built.append(
            f"{_PREF_TYPE}{{weight: {soft.weight}, preference: {_PREF_TYPE}.preference{{"
            f"matchExpressions: [{expressions}]}}}}"
        )
    if not wanted:
        return None
    # One `add .../-` per term, each value one object: a JSON Patch value that is a *list* of
    # objects can reach the API server's conversion as a plain cel-go list (what `map` returns,
    # and what `[] + [t]` is, since adding an empty list returns the other one), whose
    # ConvertToNative to structpb.Value panics (Kubernetes 1.36.3). A panic is not covered by
    # failurePolicy: the pod create fails.
    pointer = f"{_NODE_AFFINITY_PATH}/preferredDuringSchedulingIgnoredDuringExecution/-"
    chosen = " + ".join(
        f"({index} in variables.preferredWanted ? "
        f"[JSONPatch{{op: 'add', path: '{pointer}', value: {term}}}] : [])"
        for index, term in enumerate(built)
    )
    return " + ".join(wanted), chosen


def _ours(key: str) -> str:
    """CEL list ``[key, its JSON Pointer segment]``."""
    return f"[{_quote(key)}, {_quote(_escape_pointer(key))}]"


def _pod_mutation_variables(cfg: Config) -> list[dict[str, str]]:
    """What the one JSON Patch is made of, each computed once per evaluation."""
    cut = MAX_COPIED_VALUE
    stamp_key, stuck_key, excluded_key = (
        POLICY_STAMP_ANNOTATION,
        STUCK_AFTER_ANNOTATION,
        EXCLUDED_NODES_ANNOTATION,
    )
    preferred = _preferred(cfg)
    wanted = preferred[0] if preferred else "[]"
    return [
        {
            "name": "stamp",
            "expression": (
                f"size(variables.policy) > {cut} ? variables.policy.substring(0, {cut}) "
                ": variables.policy"
            ),
        },
        {
            "name": "keepStuck",
            "expression": (f"variables.stuckAfter != '' && size(variables.stuckAfter) <= {cut}"),
        },
        {
            # [key, pointer, value] of each annotation of ours the pod must carry, as the
            # webhook's `mutate` sets them.
            "name": "setAnnotations",
            "expression": (
                f"((variables.hasPolicy ? [[{_quote(stamp_key)}, "
                f"{_quote(_escape_pointer(stamp_key))}, variables.stamp]] : []) + "
                f"(variables.hasPolicy && variables.keepStuck ? [[{_quote(stuck_key)}, "
                f"{_quote(_escape_pointer(stuck_key))}, variables.stuckAfter]] : []) + "
                f"(size(variables.excluded) > 0 ? [[{_quote(excluded_key)}, "
                f"{_quote(_escape_pointer(excluded_key))}, "
                "'[\"' + variables.excluded.join('\",\"') + '\"]']] : []))"
                ".filter(a, !(a[0] in variables.podAnnotations) || "
                "variables.podAnnotations[a[0]] != a[2])"
            ),
        },
        {
            # [key, pointer] of each annotation of ours the pod carries and must not (copied
            # from a template or another pod's manifest).
            "name": "dropAnnotations",
            "expression": (
                f"((!variables.hasPolicy ? [{_ours(stamp_key)}] : []) + "
                f"(variables.hasPolicy && !variables.keepStuck ? [{_ours(stuck_key)}] : []) + "
                f"(size(variables.excluded) == 0 ? [{_ours(excluded_key)}] : []))"
                ".filter(a, a[0] in variables.podAnnotations)"
            ),
        },
        {
            # The API refuses annotations past 256 KiB in all (keys and values, in bytes), and
            # failurePolicy does not cover that: a pod our stamps would take past it is left
            # as it is, as the webhook leaves it.
            "name": "roomForStamps",
            "expression": (
                "variables.podAnnotations.map(k, size(bytes(k)) + "
                "size(bytes(variables.podAnnotations[k]))).sum() + "
                "variables.setAnnotations.map(a, size(bytes(a[0])) + size(bytes(a[2]))).sum() "
                f"<= {ANNOTATIONS_SIZE_LIMIT}"
            ),
        },
        {"name": "required", "expression": "size(variables.excluded) > 0 && !variables.bound"},
        {"name": "preferredWanted", "expression": f"variables.bound ? [] : {wanted}"},
    ]


def _pod_mutation(cfg: Config) -> dict[str, Any]:
    """One JSON Patch for everything: each mutation of a policy costs the API server an encode
    and a decode of the whole pod, and an ApplyConfiguration may not touch atomic values (both
    node affinity fields are: a NodeSelector is an atomic struct, preferred terms an atomic
    list). ``add`` on a member that exists replaces it; parents the pod lacks are added first,
    empty, and filled by the operations after them."""
    label_ptr = _quote("/metadata/labels/" + _escape_pointer(OPTED_IN_LABEL))
    label = (
        f"(variables.hasPolicy && variables.labels[?{_quote(OPTED_IN_LABEL)}].orValue('') != "
        f"{_quote(OPTED_IN_VALUE)} ? "
        "(has(object.metadata.labels) ? [] : "
        "[JSONPatch{op: 'add', path: '/metadata/labels', value: {}}]) + "
        f"[JSONPatch{{op: 'add', path: {label_ptr}, value: {_quote(OPTED_IN_VALUE)}}}] : "
        f"!variables.hasPolicy && {_quote(OPTED_IN_LABEL)} in variables.labels ? "
        f"[JSONPatch{{op: 'remove', path: {label_ptr}}}] : [])"
    )
    annotations = (
        "(size(variables.setAnnotations) > 0 && !has(object.metadata.annotations) ? "
        "[JSONPatch{op: 'add', path: '/metadata/annotations', value: {}}] : []) + "
        "variables.setAnnotations.map(a, JSONPatch{op: 'add', "
        "path: '/metadata/annotations/' + a[1], value: a[2]}) + "
        "variables.dropAnnotations.map(a, JSONPatch{op: 'remove', "
        "path: '/metadata/annotations/' + a[1]})"
    )
    # Required terms are ORed: each non-empty one gets every requirement; an empty term
    # matches no node and stays empty (adding to it would turn "nothing" into "everything but
    # these"). One requirement per node: a node field selector takes one value for NotIn.
    missing = (
        "variables.excluded.filter(n, !t.?matchFields.orValue([]).exists(f, "
        f"f.key == {_quote(NODE_NAME_FIELD)} && f.operator == 'NotIn' && "
        "f.?values.orValue([]) == [n]))"
        f".map(n, {_TERM_TYPE}.matchFields{{key: {_quote(NODE_NAME_FIELD)}, "
        "operator: 'NotIn', values: [n]})"
    )
    ours = (
        f"variables.excluded.map(n, {_TERM_TYPE}.matchFields{{key: "
        f"{_quote(NODE_NAME_FIELD)}, operator: 'NotIn', values: [n]}})"
    )
    terms = (
        "object.spec.?affinity.?nodeAffinity.?requiredDuringSchedulingIgnoredDuringExecution"
        ".?nodeSelectorTerms.orValue([])"
    )
    merged = (
        f"size({terms}) == 0 ? [{_TERM_TYPE}{{matchFields: {ours}}}] : "
        f"{terms}.map(t, size(t.?matchExpressions.orValue([])) == 0 && "
        f"size(t.?matchFields.orValue([])) == 0 ? {_TERM_TYPE}{{}} : {_TERM_TYPE}{{"
        "matchExpressions: t.?matchExpressions.orValue([]), "
        f"matchFields: t.?matchFields.orValue([]) + {missing}}})"
    )
    preferred = _preferred(cfg)
    affinity = _affinity_ops(
        preferred[1] if preferred else "[]",
        required=f"{_TERM_TYPE.rsplit('.', 1)[0]}{{nodeSelectorTerms: ({merged})}}",
    )
    return _json_patch(f"variables.roomForStamps ? {label} + {annotations} + {affinity} : []")


_NODE_AFFINITY_PATH: Final = "/spec/affinity/nodeAffinity"


def _affinity_ops(added: str, *, required: str | None) -> str:
    """CEL: the JSON Patch operations writing the node affinity: ``required`` (the whole
    NodeSelector, when ``variables.required``) and ``added`` (operations appending preferred
    terms, when ``variables.preferredWanted`` is not empty). Parents the pod lacks come first,
    empty: an empty list as a value converts fine, a list of objects may not (`_preferred`)."""
    want_required = "variables.required" if required is not None else "false"
    ops = (
        f"({want_required} || size(variables.preferredWanted) > 0 ? "
        "(has(object.spec.affinity) ? [] : "
        "[JSONPatch{op: 'add', path: '/spec/affinity', value: {}}]) + "
        "(object.spec.?affinity.?nodeAffinity.hasValue() ? [] : "
        f"[JSONPatch{{op: 'add', path: '{_NODE_AFFINITY_PATH}', value: {{}}}}]) : [])"
    )
    if required is not None:
        ops += (
            " + (variables.required ? "
            f"[JSONPatch{{op: 'add', path: '{_NODE_AFFINITY_PATH}/"
            f"requiredDuringSchedulingIgnoredDuringExecution', value: {required}}}] : [])"
        )
    return ops + (
        " + (size(variables.preferredWanted) > 0 && !object.spec.?affinity.?nodeAffinity"
        ".?preferredDuringSchedulingIgnoredDuringExecution.hasValue() ? "
        f"[JSONPatch{{op: 'add', path: '{_NODE_AFFINITY_PATH}/"
        "preferredDuringSchedulingIgnoredDuringExecution', value: []}] : []) + "
        f"{added}"
    )


def _has_work(holder: str, cfg: Config) -> str:
    """CEL: whether the policy can have anything to do for this pod (a match condition: a pod
    for which it has not is not encoded, patched and decoded at all). A policy on the holder,
    a mark of ours on the pod, or a preference the holder asks for (the namespace's are the
    namespace policy's)."""
    annotations = f"{holder}.metadata.?annotations.orValue({{}})"
    pod_annotations = "object.metadata.?annotations.orValue({})"
    ours = [POLICY_STAMP_ANNOTATION, STUCK_AFTER_ANNOTATION, EXCLUDED_NODES_ANNOTATION]
    clauses = [
        f"{_quote(POLICY_ANNOTATION)} in {annotations}",
        f"{_quote(OPTED_IN_LABEL)} in object.metadata.?labels.orValue({{}})",
        *(f"{_quote(key)} in {pod_annotations}" for key in ours),
    ]
    asked = []
    if cfg.pressure_affinity_weight:
        asked.append(AVOID_PRESSURE_KEY)
    if cfg.load_affinity_weight:
        asked.append(LOAD_AWARE_KEY)
    for key in asked:
        clauses.append(f"{annotations}[?{_quote(key)}].orValue('') == 'true'")
    return " || ".join(clauses)


def _match_constraints(
    resource: str, group: str, excluded_namespaces: tuple[str, ...]
) -> dict[str, Any]:
    return {
        "resourceRules": [
            {
                "apiGroups": [group],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": [resource],
            }
        ],
        "namespaceSelector": {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": list(excluded_namespaces),
                }
            ]
        },
        "objectSelector": {
            "matchExpressions": [{"key": OPT_OUT_LABEL, "operator": "DoesNotExist"}]
        },
    }


def _controller_is(kind: OwnerKind, uid: str) -> str:
    return (
        "object.metadata.?ownerReferences.orValue([]).exists(r, r.?controller.orValue(false) && "
        f"r.apiVersion == {_quote(kind.api_version)} && r.kind == {_quote(kind.kind)} && "
        f"r.uid == {uid})"
    )


def _metadata(name: str) -> dict[str, Any]:
    return {"name": NAME_PREFIX + name, "labels": dict(PART_OF)}


def pod_policy(kind: OwnerKind | None, cfg: Config) -> dict[str, Any]:
    """The policy for pods whose controller is ``kind`` (None: pods without a controller)."""
    holder = "object" if kind is None else "params"
    has_work = {"name": "has-work", "expression": _has_work(holder, cfg)}
    spec: dict[str, Any] = {
        "matchConstraints": _match_constraints("pods", "", _excluded(cfg)),
        "variables": _pod_variables(holder, kind, cfg.max_retries) + _pod_mutation_variables(cfg),
        "mutations": [_pod_mutation(cfg)],
        "failurePolicy": "Ignore",
        "reinvocationPolicy": "Never",
    }
    if kind is None:
        spec["matchConditions"] = [
            {
                "name": "no-controller",
                "expression": (
                    "!object.metadata.?ownerReferences.orValue([])"
                    ".exists(r, r.?controller.orValue(false))"
                ),
            },
            has_work,
        ]
    else:
        spec["paramKind"] = {"apiVersion": kind.api_version, "kind": kind.kind}
        spec["matchConditions"] = [
            {
                # Listed first: the API server stops at the first false condition, and this
                # one is false for every param but one.
                "name": "param-is-the-controller",
                "expression": _controller_is(kind, "params.metadata.uid"),
            },
            has_work,
        ]
    name = "pods-" + (kind.name if kind is not None else "without-controller")
    return {
        "apiVersion": API_VERSION,
        "kind": "MutatingAdmissionPolicy",
        "metadata": _metadata(name),
        "spec": spec,
    }


def job_policy(cfg: Config) -> dict[str, Any]:
    """The Ignore DisruptionTarget rule for a Job that asks (``shared.workloads.jobs``)."""
    annotations = "object.metadata.?annotations.orValue({})"
    policy = f"{annotations}[?{_quote(POLICY_ANNOTATION)}].orValue('')"
    asked = (
        f"{annotations}[?{_quote(IGNORE_DISRUPTIONS_ANNOTATION)}].orValue('')"
        ".trim().lowerAscii() == 'true'"
    )
    moves = (
        f"({policy}.matches('^0*[0-9]{{1,6}}$') && int({policy}) >= 1 && "
        f"int({policy}) <= {cfg.max_retries})"
    )
    rule = (
        "Object.spec.podFailurePolicy.rules{action: 'Ignore', onPodConditions: ["
        "Object.spec.podFailurePolicy.rules.onPodConditions{type: 'DisruptionTarget', "
        "status: 'True'}]}"
    )
    return {
        "apiVersion": API_VERSION,
        "kind": "MutatingAdmissionPolicy",
        "metadata": _metadata("jobs"),
        "spec": {
            "matchConstraints": _match_constraints("jobs", "batch", _excluded(cfg)),
            "matchConditions": [
                {"name": "ignore-disruptions-asked", "expression": f"{asked} && {moves}"},
                {
                    # A pod failure policy requires restartPolicy Never; one the user wrote is
                    # theirs; a Job another controller manages is not the built-in's to read.
                    "name": "rule-can-be-added",
                    "expression": (
                        "object.spec.template.spec.?restartPolicy.orValue('') == 'Never' && "
                        "!has(object.spec.podFailurePolicy) && "
                        "object.spec.?managedBy.orValue('kubernetes.io/job-controller') in "
                        "['', 'kubernetes.io/job-controller']"
                    ),
                },
            ],
            "mutations": [
                # JSON Patch: the rules are an atomic list, which an apply may not touch (the
                # match condition has seen the Job has no policy of its own). Replacements must
                # wait for a terminal pod with a pod failure policy: the Job arrives defaulted,
                # so a TerminatingOrFailed here is usually the default.
                _json_patch(
                    "[JSONPatch{op: 'add', path: '/spec/podFailurePolicy', value: "
                    + _obj("Object.spec.podFailurePolicy", rules=f"[{rule}]")
                    + "}] + (has(object.spec.podReplacementPolicy) ? [JSONPatch{op: 'add', "
                    "path: '/spec/podReplacementPolicy', value: 'Failed'}] : [])"
                ),
            ],
            "failurePolicy": "Ignore",
            "reinvocationPolicy": "Never",
        },
    }


def _namespaces(excluded: tuple[str, ...]) -> dict[str, Any]:
    return {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": list(excluded)}
        ]
    }


def _followed_or_none() -> str:
    """CEL: the pod has no controller, or one of a kind we follow (the webhook's resolve)."""
    kinds = " || ".join(
        f"(r.apiVersion == {_quote(k.api_version)} && r.kind == {_quote(k.kind)})"
        for k in OWNER_KINDS
    )
    controllers = (
        "object.metadata.?ownerReferences.orValue([]).filter(r, r.?controller.orValue(false))"
    )
    return f"{controllers}.all(r, {kinds})"


def namespace_policies(cfg: Config) -> list[dict[str, Any]]:
    """The preferences a namespace asks for with a label, for every pod of a followed owner (or
    none) in it: policies without params, so that owners without an annotation of ours (not
    params) need not be read. One per label, each selecting its namespaces: a match condition
    cannot read the namespace (the API server gives it none), and a mutation that ran in every
    namespace would cost every pod create an encode and a decode."""
    out = []
    for key, name in ((AVOID_PRESSURE_KEY, "avoid-pressure"), (LOAD_AWARE_KEY, "load-aware")):
        preferred = _preferred(cfg, namespace=True, only=key)
        if preferred is None:
            continue
        wanted, added = preferred
        constraints = _match_constraints("pods", "", _excluded(cfg))
        constraints["namespaceSelector"]["matchLabels"] = {key: "true"}
        out.append(
            {
                "apiVersion": API_VERSION,
                "kind": "MutatingAdmissionPolicy",
                "metadata": _metadata(f"pods-namespace-{name}"),
                "spec": {
                    "matchConstraints": constraints,
                    "matchConditions": [
                        {"name": "owner-followed", "expression": _followed_or_none()}
                    ],
                    "variables": [
                        {"name": "bound", "expression": "object.spec.?nodeName.orValue('') != ''"},
                        {
                            "name": "preferred",
                            "expression": (
                                "object.spec.?affinity.?nodeAffinity"
                                ".?preferredDuringSchedulingIgnoredDuringExecution.orValue([])"
                            ),
                        },
                        {
                            "name": "preferredWanted",
                            "expression": f"variables.bound ? [] : {wanted}",
                        },
                    ],
                    "mutations": [_json_patch(_affinity_ops(added, required=None))],
                    "failurePolicy": "Ignore",
                    "reinvocationPolicy": "Never",
                },
            }
        )
    return out


def holder_policy(cfg: Config) -> dict[str, Any]:
    """The label that makes a ReplicaSet, StatefulSet or Job a param of the pod policies, put on
    at its create or any update while it carries an annotation a pod's admission reads and may
    create pods, taken off when either stops. A Deployment's annotations reach its ReplicaSet
    as the controller copies them (an update), so its ReplicaSets are labelled too.

    A ReplicaSet scaled to 0 creates no pod, so it is no param: a Deployment keeps ten old
    ReplicaSets by default, each with the annotations copied, and every param of a namespace
    costs each pod create there one evaluation. The Deployment controller scales them with
    updates, so the update that scales one up again (a rollback) labels it. But one created at
    0 (a rollout's new ReplicaSet, a Deployment created at 0) is a param from its create: the
    update that scales it up is followed at once by its pods' creates, and the API server's
    informer of params would not yet have the label (its first pods went unstamped, seen in
    the demo's scaled-up Deployment). A StatefulSet stays
    a param at 0: ``kubectl scale``, an HPA or KEDA scale it through its ``scale`` subresource,
    which this policy never sees (a Scale is not a StatefulSet), and it has no old revisions to
    pile up. Only ``true`` asks for a preference, as the pod policies read it."""
    annotations = "object.metadata.?annotations.orValue({})"
    keys = [POLICY_ANNOTATION]
    keys += [AVOID_PRESSURE_KEY] if cfg.pressure_affinity_weight else []
    keys += [LOAD_AWARE_KEY] if cfg.load_affinity_weight else []
    asked = [f"{_quote(POLICY_ANNOTATION)} in {annotations}"] + [
        f"{annotations}[?{_quote(key)}].orValue('') == 'true'" for key in keys[1:]
    ]
    asks = (
        "("
        + " || ".join(asked)
        + ") && (object.kind != 'ReplicaSet' || object.spec.?replicas.orValue(1) > 0"
        + " || request.operation == 'CREATE')"
    )
    labelled = (
        f"object.metadata.?labels.orValue({{}})[?{_quote(ADMISSION_PARAM_LABEL)}]"
        f".orValue('') == {_quote(ADMISSION_PARAM_VALUE)}"
    )
    present = f"{_quote(ADMISSION_PARAM_LABEL)} in object.metadata.?labels.orValue({{}})"
    pointer = _quote("/metadata/labels/" + _escape_pointer(ADMISSION_PARAM_LABEL))
    return {
        "apiVersion": API_VERSION,
        "kind": "MutatingAdmissionPolicy",
        "metadata": _metadata("admission-params"),
        "spec": {
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["apps"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["replicasets", "statefulsets"],
                    },
                    {
                        "apiGroups": ["batch"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["jobs"],
                    },
                ],
                "namespaceSelector": _namespaces(_excluded(cfg)),
            },
            "variables": [
                {"name": "asks", "expression": asks},
                {"name": "labelled", "expression": labelled},
            ],
            # Only when the label is wrong: every other create and update costs one condition.
            "matchConditions": [
                {
                    "name": "label-out-of-step",
                    "expression": f"({asks}) != ({labelled}) || (!({asks}) && {present})",
                }
            ],
            "mutations": [
                _json_patch(
                    "variables.asks ? (has(object.metadata.labels) ? [] : "
                    "[JSONPatch{op: 'add', path: '/metadata/labels', value: {}}]) + "
                    f"[JSONPatch{{op: 'add', path: {pointer}, "
                    f"value: {_quote(ADMISSION_PARAM_VALUE)}}}] : "
                    f"[JSONPatch{{op: 'remove', path: {pointer}}}]"
                )
            ],
            "failurePolicy": "Ignore",
            "reinvocationPolicy": "Never",
        },
    }


def binding(policy: Mapping[str, Any]) -> dict[str, Any]:
    """The binding that puts a policy in force; with params: the objects of the param kind in
    the pod's namespace that carry the admission-param label (the match condition keeps its
    controller only); none there: the policy is not evaluated at all."""
    spec: dict[str, Any] = {
        "policyName": policy["metadata"]["name"],
    }
    if "paramKind" in policy["spec"]:
        spec["paramRef"] = {
            "selector": {"matchLabels": {ADMISSION_PARAM_LABEL: ADMISSION_PARAM_VALUE}},
            "parameterNotFoundAction": "Allow",
        }
    return {
        "apiVersion": API_VERSION,
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": policy["metadata"]["name"], "labels": dict(PART_OF)},
        "spec": spec,
    }


def _excluded(cfg: Config) -> tuple[str, ...]:
    """The namespaces left alone, the project's own always among them, sorted (the rendered
    file must not change with set order)."""
    return tuple(sorted({*cfg.excluded_namespaces, cfg.namespace}))


def render(cfg: Config) -> list[dict[str, Any]]:
    """Every policy and binding, in the order they are applied."""
    policies = [holder_policy(cfg)]
    policies += [pod_policy(kind, cfg) for kind in OWNER_KINDS]
    policies.append(pod_policy(None, cfg))
    policies += namespace_policies(cfg)
    policies.append(job_policy(cfg))
    out: list[dict[str, Any]] = []
    for policy in policies:
        out.append(policy)
        out.append(binding(policy))
    return out
