"""The admission policies as rendered (shared/admission/policies.py, dev/tools/policies.py).

What the API server makes of them is tested on the real one: tests/e2e/test_admission_policies.py
runs the pipeline's stories with them and no webhook, and compares each admitted pod with the
webhook's own decision. Here: the committed component is what the code renders, and the shape
of what is rendered.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import yaml

from dev.tools import policies as tool
from shared.admission.policies import OWNER_KINDS, render
from shared.platform.config import Config

CFG = Config()


def objects(cfg: Config = CFG) -> dict[str, dict[str, Any]]:
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in render(cfg)}


def test_the_committed_component_is_what_the_generator_writes() -> None:
    assert tool.main(["--check"]) == 0


def test_the_component_removes_every_webhook_object_and_adds_the_policies() -> None:
    component = yaml.safe_load((tool.COMPONENT / "kustomization.yaml").read_text())
    deleted = {
        (p["kind"], p["metadata"]["name"])
        for p in (yaml.safe_load(patch["patch"]) for patch in component["patches"])
    }
    assert ("MutatingWebhookConfiguration", "kn-rescheduler-mutate-admission") in deleted
    assert ("Service", "mutate-admission") in deleted  # the Knative Service
    assert ("ClusterRole", "kn-rescheduler-mutate-admission") in deleted
    assert component["resources"] == ["policies.yaml"]


def test_every_policy_has_its_binding_and_never_blocks_a_create() -> None:
    rendered = objects()
    policies = [o for o in rendered.values() if o["kind"] == "MutatingAdmissionPolicy"]
    # the param label; one per owner kind, bare pods; two namespace preferences; Jobs
    assert len(policies) == 1 + len(OWNER_KINDS) + 1 + 2 + 1
    for policy in policies:
        name = policy["metadata"]["name"]
        assert policy["spec"]["failurePolicy"] == "Ignore"
        assert policy["spec"]["reinvocationPolicy"] == "Never"
        assert rendered[f"MutatingAdmissionPolicyBinding/{name}"]["spec"]["policyName"] == name
        operations = {
            op
            for rule in policy["spec"]["matchConstraints"]["resourceRules"]
            for op in rule["operations"]
        }
        # Only the param label follows updates (of workloads, never of pods).
        assert operations == ({"CREATE", "UPDATE"} if "params" in name else {"CREATE"})


def test_a_policy_with_params_evaluates_only_the_labelled_param_that_is_the_pods_controller() -> (
    None
):
    for kind in OWNER_KINDS:
        policy = objects()[f"MutatingAdmissionPolicy/kn-rescheduler-pods-{kind.name}"]
        assert policy["spec"]["paramKind"] == {"apiVersion": kind.api_version, "kind": kind.kind}
        first, has_work = policy["spec"]["matchConditions"]
        assert "r.uid == params.metadata.uid" in first["expression"]
        assert f"r.kind == '{kind.kind}'" in first["expression"]
        assert "'scheduling-retries' in params.metadata" in has_work["expression"]
        binding = objects()[f"MutatingAdmissionPolicyBinding/kn-rescheduler-pods-{kind.name}"]
        # Only workloads with an annotation of ours; none there: not evaluated at all.
        assert binding["spec"]["paramRef"] == {
            "selector": {"matchLabels": {"kn-rescheduler.io/admission-param": "true"}},
            "parameterNotFoundAction": "Allow",
        }


def test_the_param_label_follows_the_annotations_that_make_a_workload_a_param() -> None:
    policy = objects()["MutatingAdmissionPolicy/kn-rescheduler-admission-params"]
    resources = {
        r for rule in policy["spec"]["matchConstraints"]["resourceRules"] for r in rule["resources"]
    }
    assert resources == {"replicasets", "statefulsets", "jobs"}
    asks = policy["spec"]["variables"][0]["expression"]
    assert "'scheduling-retries' in" in asks
    for key in ("kn-rescheduler.io/avoid-pressure", "kn-rescheduler.io/load-aware"):
        # Only "true" asks, as the pod policies read it: "false" makes no useless param.
        assert f"[?'{key}'].orValue('') == 'true'" in asks
    # Only a ReplicaSet at 0 is no param: a StatefulSet is scaled through its scale
    # subresource, which the policy never sees.
    assert "object.kind != 'ReplicaSet' || object.spec.?replicas.orValue(1) > 0" in asks
    # Without the weights, those annotations change nothing a pod gets: no label for them.
    bare = replace(CFG, pressure_affinity_weight=0, load_affinity_weight=0)
    asks = objects(bare)["MutatingAdmissionPolicy/kn-rescheduler-admission-params"]["spec"][
        "variables"
    ][0]["expression"]
    assert "avoid-pressure" not in asks and "load-aware" not in asks


def test_a_namespace_label_asks_through_a_policy_of_its_own_per_label() -> None:
    rendered = objects()
    for key, name in (
        ("kn-rescheduler.io/avoid-pressure", "avoid-pressure"),
        ("kn-rescheduler.io/load-aware", "load-aware"),
    ):
        policy = rendered[f"MutatingAdmissionPolicy/kn-rescheduler-pods-namespace-{name}"]
        # A match condition cannot read the namespace: its selector chooses the namespaces.
        assert policy["spec"]["matchConstraints"]["namespaceSelector"]["matchLabels"] == {
            key: "true"
        }
        assert "paramKind" not in policy["spec"]
    assert not any(
        "namespace-load-aware" in k for k in objects(replace(CFG, load_affinity_weight=0))
    )


def test_the_namespaces_left_alone_always_include_the_projects_own_and_are_sorted() -> None:
    cfg = replace(Config(), excluded_namespaces=frozenset({"zeta", "alpha"}), namespace="ours")
    for obj in render(cfg):
        if obj["kind"] != "MutatingAdmissionPolicy":
            continue
        (expression,) = obj["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"]
        assert expression["values"] == ["alpha", "ours", "zeta"]


def test_a_weight_of_0_adds_no_preference_and_the_settings_reach_the_expressions() -> None:
    def text(cfg: Config) -> str:
        return yaml.safe_dump(render(cfg), width=10**9)

    base = Config()
    assert "kn-rescheduler.io/suspect" not in text(replace(base, suspect_affinity_weight=0))
    assert "kn-rescheduler.io/suspect" in text(replace(base, suspect_affinity_weight=15))
    assert "weight: 33" not in text(base)
    assert "weight: 33" in text(replace(base, pressure_affinity_weight=33))
    assert "variables.retries <= 7" in text(replace(base, max_retries=7))
