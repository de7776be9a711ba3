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
    assert len(policies) == len(OWNER_KINDS) + 2  # one per owner kind, bare pods, Jobs
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
        assert operations == {"CREATE"}


def test_a_policy_with_params_evaluates_only_the_param_that_is_the_pods_controller() -> None:
    for kind in OWNER_KINDS:
        policy = objects()[f"MutatingAdmissionPolicy/kn-rescheduler-pods-{kind.name}"]
        assert policy["spec"]["paramKind"] == {"apiVersion": kind.api_version, "kind": kind.kind}
        (condition,) = policy["spec"]["matchConditions"]
        assert "r.uid == params.metadata.uid" in condition["expression"]
        assert f"r.kind == '{kind.kind}'" in condition["expression"]
        binding = objects()[f"MutatingAdmissionPolicyBinding/kn-rescheduler-pods-{kind.name}"]
        # Every object of the kind in the pod's namespace; none there: not evaluated at all.
        assert binding["spec"]["paramRef"] == {"selector": {}, "parameterNotFoundAction": "Allow"}


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
