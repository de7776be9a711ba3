"""The MutatingAdmissionPolicies that do mutate-admission's work inside the API server.

On Kubernetes 1.36 (MutatingAdmissionPolicy GA; beta behind a gate in 1.34-1.35) the API server
can apply CEL mutations itself: no network hop, no certificate, nothing to be down while pods
are created. A policy sees the pod being created, the request, its namespace and *params*, but
never looks anything up, so the webhook's one lookup (the pod's owner) becomes a param:

- One policy per owner kind we follow (ReplicaSet, StatefulSet, Job), whose ``paramKind`` is that
  kind and whose binding selects every object of it in the pod's namespace. The API server
  evaluates a policy once per selected param; the match condition keeps only the param that is
  the pod's controller (same uid), so exactly one evaluation goes on to mutate. The params come
  from the API server's own informer: no request leaves it.
- A Deployment's policy is on its ReplicaSets too: the Deployment controller copies the
  Deployment's annotations onto the newest one on every sync
  (``copyDeploymentAnnotationsToReplicaSet``), as the webhook reads them.
- A bare pod is its own param (a policy without ``paramKind``): a bare pod's policy and state are
  its own annotations.
- The state is JSON, and CEL has no JSON decoder, so update-annotations writes the exclusions a
  second time beside it, flat (``shared.api.avoidnodes``), prefixed with the holder's uid: a copy
  on another object (``kubectl rollout undo`` copies annotations both ways) does not apply.

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
- Never write outside our keys: ``ApplyConfiguration`` merges maps key by key, so labels and
  annotations are added, never replaced. The two node-affinity lists are atomic, so they are
  rewritten whole, from the pod's own terms plus ours: a required term the pod has gets our
  requirements added (an empty term, which matches no node, is left empty), a preferred term it
  already has is not added twice.
- Survive a missing or malformed param: no param means no evaluation; a flat list that does not
  parse, names another object's uid, or names an invalid node gives no exclusion at all.

What the webhook does that a policy cannot, and what replaces it, is in docs/install-choices.md
("Admission: webhook or policies").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from shared.admission.decide import MAX_COPIED_VALUE
from shared.api.avoidnodes import ANNOTATION as AVOID_NODES_ANNOTATION
from shared.api.avoidnodes import ANY_POD, SEPARATOR
from shared.api.keys import (
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


def _spec_patch(**fields: str) -> str:
    """``Object{spec: Object.spec{...}}``."""
    return _obj("Object", spec=_obj("Object.spec", **fields))


_NODE_AFFINITY: Final = "Object.spec.affinity.nodeAffinity"


def _set_node_affinity(field: str, value: str) -> str:
    """JSON Patch operations (CEL) setting ``spec.affinity.nodeAffinity.<field>`` to ``value``
    (of the field's type, ``<_NODE_AFFINITY>.<field>``), adding the parents the pod lacks.

    JSON Patch, not an apply: both node affinity fields are atomic (a NodeSelector is an atomic
    struct, preferred terms an atomic list), and an ApplyConfiguration may not touch atomic
    values at all. ``add`` on a member that exists replaces it, so the deepest parent the pod
    has decides the path. ``object`` here is the pod after this policy's earlier mutations.
    """
    inner = _obj(_NODE_AFFINITY, **{field: value})
    return (
        f"(!has(object.spec.affinity) ? [JSONPatch{{op: 'add', path: '/spec/affinity', "
        f"value: {_obj('Object.spec.affinity', nodeAffinity=inner)}}}] : "
        f"!has(object.spec.affinity.nodeAffinity) ? [JSONPatch{{op: 'add', "
        f"path: '/spec/affinity/nodeAffinity', value: {inner}}}] : "
        f"[JSONPatch{{op: 'add', path: '/spec/affinity/nodeAffinity/{field}', value: {value}}}])"
    )


def _escape_pointer(key: str) -> str:
    """A map key as a JSON Pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def _pod_variables(holder: str, kind: OwnerKind | None, max_retries: int) -> list[dict[str, str]]:
    """What every pod policy computes before it mutates; ``holder`` is the CEL name of the
    object carrying the policy and state (``params``, or ``object`` for a bare pod)."""
    scope = "object.metadata.name" if kind is not None and kind.per_pod else _quote(ANY_POD)
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
                f"size(variables.flat) >= 2 && {uid_ok} ? "
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
            # which failurePolicy does not cover.
            "name": "excluded",
            "expression": (
                f"variables.moves && size(variables.listed) <= {MAX_EXCLUDED_NODES} && "
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


def _apply(expression: str) -> dict[str, Any]:
    return {
        "patchType": "ApplyConfiguration",
        "applyConfiguration": {"expression": expression},
    }


def _json_patch(expression: str) -> dict[str, Any]:
    return {"patchType": "JSONPatch", "jsonPatch": {"expression": expression}}


def _stamp_mutations() -> list[dict[str, Any]]:
    """The opted-in label and the policy stamp; stuck-after beside it; stale ones removed."""
    cut = MAX_COPIED_VALUE
    policy = (
        f"size(variables.policy) > {cut} ? variables.policy.substring(0, {cut}) : variables.policy"
    )
    stamp = (
        "variables.hasPolicy ? Object{metadata: Object.metadata{"
        f"labels: {{{_quote(OPTED_IN_LABEL)}: {_quote(OPTED_IN_VALUE)}}}, "
        f"annotations: {{{_quote(POLICY_STAMP_ANNOTATION)}: {policy}}}}}}} : Object{{}}"
    )
    stuck = (
        f"variables.hasPolicy && variables.stuckAfter != '' && "
        f"size(variables.stuckAfter) <= {cut} ? Object{{metadata: Object.metadata{{"
        f"annotations: {{{_quote(STUCK_AFTER_ANNOTATION)}: variables.stuckAfter}}}}}} : Object{{}}"
    )
    # Stamps of ours on a pod whose holder does not give them (copied from a template or
    # another pod's manifest): removed, so the pod never looks opted in. JSONPatch: an apply
    # can add keys to a map but not remove them.
    removals = []
    for key, path, when in (
        (OPTED_IN_LABEL, "labels", "!variables.hasPolicy"),
        (POLICY_STAMP_ANNOTATION, "annotations", "!variables.hasPolicy"),
        (
            STUCK_AFTER_ANNOTATION,
            "annotations",
            f"(!variables.hasPolicy || variables.stuckAfter == '' || "
            f"size(variables.stuckAfter) > {cut})",
        ),
        (EXCLUDED_NODES_ANNOTATION, "annotations", "size(variables.excluded) == 0"),
    ):
        where = (
            "object.metadata.?labels.orValue({})"
            if path == "labels"
            else ("variables.podAnnotations")
        )
        removals.append(
            f"({when} && {_quote(key)} in {where} ? "
            f"[JSONPatch{{op: 'remove', path: "
            f"{_quote('/metadata/' + path + '/' + _escape_pointer(key))}}}] : [])"
        )
    return [
        _apply(stamp),
        _apply(stuck),
        _json_patch(" + ".join(removals)),
    ]


def _exclusion_mutations() -> list[dict[str, Any]]:
    """The required node affinity away from the excluded nodes, merged into the pod's own,
    and the excluded-nodes stamp that says so."""
    # One requirement per node: a node field selector takes exactly one value for NotIn.
    ours = (
        f"variables.excluded.map(n, {_TERM_TYPE}.matchFields{{key: "
        f"{_quote(NODE_NAME_FIELD)}, operator: 'NotIn', values: [n]}})"
    )
    missing = (
        "variables.excluded.filter(n, !t.?matchFields.orValue([]).exists(f, "
        f"f.key == {_quote(NODE_NAME_FIELD)} && f.operator == 'NotIn' && "
        "f.?values.orValue([]) == [n]))"
        f".map(n, {_TERM_TYPE}.matchFields{{key: {_quote(NODE_NAME_FIELD)}, "
        "operator: 'NotIn', values: [n]})"
    )
    terms = (
        "object.spec.?affinity.?nodeAffinity.?requiredDuringSchedulingIgnoredDuringExecution"
        ".?nodeSelectorTerms.orValue([])"
    )
    # Terms are ORed: each non-empty one gets every requirement; an empty term matches no node
    # and stays empty (adding to it would turn "nothing" into "everything but these").
    merged = (
        f"size({terms}) == 0 ? [{_TERM_TYPE}{{matchFields: {ours}}}] : "
        f"{terms}.map(t, size(t.?matchExpressions.orValue([])) == 0 && "
        f"size(t.?matchFields.orValue([])) == 0 ? {_TERM_TYPE}{{}} : {_TERM_TYPE}{{"
        "matchExpressions: t.?matchExpressions.orValue([]), "
        f"matchFields: t.?matchFields.orValue([]) + {missing}}})"
    )
    required = _obj(
        f"{_NODE_AFFINITY}.requiredDuringSchedulingIgnoredDuringExecution",
        nodeSelectorTerms=merged,
    )
    affinity = (
        "size(variables.excluded) > 0 && !variables.bound ? "
        + _set_node_affinity("requiredDuringSchedulingIgnoredDuringExecution", required)
        + " : []"
    )
    stamp = (
        "size(variables.excluded) > 0 ? Object{metadata: Object.metadata{annotations: {"
        f"{_quote(EXCLUDED_NODES_ANNOTATION)}: "
        "'[\"' + variables.excluded.join('\",\"') + '\"]'}}} : Object{}"
    )
    return [_json_patch(affinity), _apply(stamp)]


@dataclass(frozen=True)
class _Soft:
    """One preferred term: the condition under which the pod gets it, the term as CEL."""

    when: str
    weight: int
    expressions: tuple[tuple[str, str, tuple[str, ...]], ...]  # (key, operator, values)


def _soft_terms(cfg: Config) -> list[_Soft]:
    """The webhook's preferences (`Admitter._avoid`), as far as a policy can tell them apart."""
    ns_labels = "namespaceObject.metadata.?labels.orValue({})"
    soft: list[_Soft] = []
    if cfg.suspect_affinity_weight:
        soft.append(
            _Soft(
                "variables.moves",
                cfg.suspect_affinity_weight,
                ((SUSPECT_LABEL, "NotIn", (SUSPECT_VALUE,)),),
            )
        )
    if cfg.failing_affinity_weight:
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
    if cfg.pressure_affinity_weight:
        key, _, value = cfg.pressure_label.partition("=")
        asked = (
            f"variables.moves || variables.annotations[?{_quote(AVOID_PRESSURE_KEY)}]"
            f".orValue('') == 'true' || {ns_labels}[?{_quote(AVOID_PRESSURE_KEY)}]"
            ".orValue('') == 'true'"
        )
        soft.append(_Soft(asked, cfg.pressure_affinity_weight, ((key, "NotIn", (value,)),)))
    if cfg.load_affinity_weight:
        asked = (
            f"variables.annotations[?{_quote(LOAD_AWARE_KEY)}].orValue('') == 'true' || "
            f"{ns_labels}[?{_quote(LOAD_AWARE_KEY)}].orValue('') == 'true'"
        )
        weight = cfg.load_affinity_weight
        soft.append(_Soft(asked, weight, ((LOAD_LABEL, "NotIn", (LOAD_HIGH, LOAD_OVERLOADED)),)))
        soft.append(
            _Soft(
                asked,
                max(1, weight // 2),
                ((LOAD_LABEL, "NotIn", (LOAD_MEDIUM, LOAD_HIGH, LOAD_OVERLOADED)),),
            )
        )
    return soft


def _list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(_quote(v) for v in values) + "]"


def _preference_mutation(cfg: Config) -> dict[str, Any] | None:
    """The preferred terms, each added when its condition holds and the pod lacks it."""
    parts = []
    for soft in _soft_terms(cfg):
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
        parts.append(
            f"({soft.when}) && !variables.preferred.exists(p, {same}) ? "
            f"[{_PREF_TYPE}{{weight: {soft.weight}, preference: {_PREF_TYPE}.preference{{"
            f"matchExpressions: [{expressions}]}}}}] : []"
        )
    if not parts:
        return None
    added = " + ".join(f"({part})" for part in parts)
    return _json_patch(
        f"!variables.bound && size({added}) > 0 ? "
        + _set_node_affinity(
            "preferredDuringSchedulingIgnoredDuringExecution", f"variables.preferred + {added}"
        )
        + " : []"
    )


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
    mutations = _stamp_mutations() + _exclusion_mutations()
    preference = _preference_mutation(cfg)
    if preference is not None:
        mutations.append(preference)
    spec: dict[str, Any] = {
        "matchConstraints": _match_constraints("pods", "", _excluded(cfg)),
        "variables": _pod_variables(holder, kind, cfg.max_retries),
        "mutations": mutations,
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
            }
        ]
    else:
        spec["paramKind"] = {"apiVersion": kind.api_version, "kind": kind.kind}
        spec["matchConditions"] = [
            {
                "name": "param-is-the-controller",
                "expression": _controller_is(kind, "params.metadata.uid"),
            }
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
                # JSON Patch: the rules are an atomic list, which an apply may not touch; the
                # match condition has seen the Job has no policy of its own.
                _json_patch(
                    "[JSONPatch{op: 'add', path: '/spec/podFailurePolicy', value: "
                    + _obj("Object.spec.podFailurePolicy", rules=f"[{rule}]")
                    + "}]"
                ),
                # Required with a pod failure policy; the Job arrives defaulted, so a
                # TerminatingOrFailed here is usually the default.
                _apply(
                    "has(object.spec.podReplacementPolicy) ? "
                    + _spec_patch(podReplacementPolicy="'Failed'")
                    + " : Object{}"
                ),
            ],
            "failurePolicy": "Ignore",
            "reinvocationPolicy": "Never",
        },
    }


def binding(policy: Mapping[str, Any]) -> dict[str, Any]:
    """The binding that puts a policy in force; with params: every object of the param kind
    in the pod's namespace (the match condition keeps its controller only), none found: the
    policy is not evaluated."""
    spec: dict[str, Any] = {
        "policyName": policy["metadata"]["name"],
    }
    if "paramKind" in policy["spec"]:
        spec["paramRef"] = {"selector": {}, "parameterNotFoundAction": "Allow"}
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
    policies = [pod_policy(kind, cfg) for kind in OWNER_KINDS]
    policies.append(pod_policy(None, cfg))
    policies.append(job_policy(cfg))
    out: list[dict[str, Any]] = []
    for policy in policies:
        out.append(policy)
        out.append(binding(policy))
    return out
