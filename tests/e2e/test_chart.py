"""The Helm chart (charts/kn-rescheduler) against the install it is generated from, knative/.

``helm template`` of each supported combination of values gives the objects kustomize renders
of knative/ with the matching components, images and CIDR: the same objects, compared as data,
with Helm's own labels and the settings ConfigMap's hash suffix set aside (the Namespace is not
the chart's: Helm's release record lives in it). The chart is what ``python -m dev.tools.chart``
writes, ``helm lint --strict`` passes, and the values a user can get wrong are refused with a
message that says which.

Helm and kubectl are the real ones, built from their Go modules (hack/build-helm.sh,
hack/build-bins.sh); no cluster is needed.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from dev.localcluster.bins import ensure_helm
from dev.tools import chart as tool
from dev.tools import config_env
from tests.e2e.knative_manifests import Obj, kubectl

pytestmark = pytest.mark.e2e

REGISTRY = "registry.example.test/acme/kn-rescheduler"
TAG = "1.2.3"
# Half the functions by digest (a release's values), half by tag.
DIGESTS = {f: "sha256:" + f"{i:x}" * 64 for i, f in enumerate(tool.FUNCTIONS) if i % 2 == 0}
CIDR = "10.96.0.0/24"
HASHED = re.compile(r"kn-rescheduler-config-[a-z0-9]{10}")
MAP_API = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"


@pytest.fixture(scope="module")
def helm() -> Path:
    return ensure_helm()


def template(
    helm: Path, values: Mapping[str, Any], *extra: str, namespace: str = "kn-rescheduler"
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(helm),
            "template",
            "kn-rescheduler",
            str(tool.CHART),
            "--namespace",
            namespace,
            "--values",
            "/dev/stdin",
            *extra,
        ],
        input=json.dumps(values),
        capture_output=True,
        text=True,
        check=False,
    )


def rendered(helm: Path, values: Mapping[str, Any], *extra: str) -> list[Obj]:
    done = template(helm, values, *extra)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def values_for(combo: tool.Combo) -> dict[str, Any]:
    on = dict(zip(tool.NAMES, combo, strict=True))
    return {
        "image": {"registry": REGISTRY, "tag": TAG, "digests": DIGESTS},
        "serving": {"enabled": not on["withoutServing"]},
        "admission": {"mode": "policies" if on["policies"] else "webhook"},
        "webhook": {
            "deployment": on["webhookDeployment"],
            "certManager": {"enabled": on["certManager"]},
            "clientAuth": {"enabled": on["clientAuth"]},
            "networkPolicy": {"enabled": on["networkPolicy"], "apiServerCIDR": CIDR},
        },
        "senderAuthentication": {"enabled": on["senderAuthentication"]},
        "loadAwareScheduler": {"enabled": on["loadAwareScheduler"]},
        "monitoring": {"enabled": on["monitoring"]},
    }


def images() -> dict[str, str]:
    return {
        f"kn-rescheduler/{f}": f"{REGISTRY}/{f}@{DIGESTS[f]}"
        if f in DIGESTS
        else f"{REGISTRY}/{f}:{TAG}"
        for f in tool.FUNCTIONS
    }


def comparable(objs: list[Obj], *, from_helm: bool) -> dict[str, str]:
    """Each object as canonical JSON by its identity: Helm's labels set aside, the settings
    ConfigMap's hash suffix made one, the Namespace left out."""
    out: dict[str, str] = {}
    for obj in objs:
        if obj["kind"] == "Namespace":
            continue
        if from_helm:
            labels = obj["metadata"].get("labels", {})
            for label in tool.HELM_LABELS:
                assert label in labels, f"{obj['kind']} {obj['metadata']['name']} lacks {label}"
                del labels[label]
        text = HASHED.sub("kn-rescheduler-config-HASH", json.dumps(obj, sort_keys=True))
        out["/".join(tool.key(json.loads(text)))] = text
    return out


def differences(kustomized: dict[str, str], helmed: dict[str, str]) -> list[str]:
    found = [f"only kustomize renders {k}" for k in sorted(kustomized.keys() - helmed.keys())]
    found += [f"only helm renders {k}" for k in sorted(helmed.keys() - kustomized.keys())]
    for k in sorted(kustomized.keys() & helmed.keys()):
        if kustomized[k] != helmed[k]:
            found.append(f"{k} differs:\n  kustomize: {kustomized[k]}\n  helm:      {helmed[k]}")
    return found


def test_the_chart_is_what_the_tool_writes_from_knative() -> None:
    files = tool.render(kubectl())
    stale = [n for n, text in files.items() if read(tool.CHART / n) != text]
    assert not stale, (
        f"charts/kn-rescheduler: {', '.join(stale)} stale: run python -m dev.tools.chart"
    )
    left = tool.left_over(files)
    assert not left, f"files in charts/kn-rescheduler nothing writes: {left}: delete them"


def read(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None


def test_helm_template_gives_kustomizes_objects_for_every_supported_combination(
    helm: Path,
) -> None:
    combos = tool.supported()
    path = kubectl()

    def compare(combo: tool.Combo) -> list[str]:
        cidr = CIDR if dict(zip(tool.NAMES, combo, strict=True))["networkPolicy"] else None
        kustomized = comparable(tool.kustomize(combo, path, images(), cidr), from_helm=False)
        helmed = comparable(rendered(helm, values_for(combo)), from_helm=True)
        return [f"[{tool.describe(combo)}] {d}" for d in differences(kustomized, helmed)]

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        found = [d for ds in pool.map(compare, combos) for d in ds]
    assert len(combos) == 200
    assert not found, "\n".join(found[:10]) + f"\n({len(found)} differences)"


def test_helm_lint_passes_strict(helm: Path) -> None:
    done = subprocess.run(
        [str(helm), "lint", "--strict", "--namespace", "kn-rescheduler", str(tool.CHART)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def settings_name(objs: list[Obj]) -> str:
    [cm] = [o for o in objs if tool.is_settings(o)]
    name: str = cm["metadata"]["name"]
    return name


def env_from(objs: list[Obj], name: str) -> list[str]:
    [ksvc] = [
        o
        for o in objs
        if o["kind"] == "Service" and o["metadata"]["name"] == name and "template" in o["spec"]
    ]
    return [
        e["configMapRef"]["name"]
        for e in ksvc["spec"]["template"]["spec"]["containers"][0]["envFrom"]
    ]


def test_a_changed_setting_is_a_new_configmap_every_function_rolls_to(helm: Path) -> None:
    plain = rendered(helm, {"admission": {"mode": "webhook"}})
    again = rendered(helm, {"admission": {"mode": "webhook"}})
    changed = rendered(
        helm, {"admission": {"mode": "webhook"}, "config": {"common": {"dryRun": True}}}
    )
    assert settings_name(plain) == settings_name(again)
    assert settings_name(changed) != settings_name(plain)
    [cm] = [o for o in changed if tool.is_settings(o)]
    assert cm["data"]["KN_RESCHEDULER_DRY_RUN"] == "true"
    for function in ("detect-failures", "update-annotations", "score-nodes"):
        assert env_from(changed, function) == [settings_name(changed)]


def test_each_group_s_value_becomes_its_variable_in_the_settings(helm: Path) -> None:
    groups = config_env.groups()
    values = {g.key: {s.key: f"set-{s.key}" for s in g.settings} for g in groups}
    [cm] = [
        o
        for o in rendered(helm, {"admission": {"mode": "webhook"}, "config": values})
        if tool.is_settings(o)
    ]
    expected = {s.env: f"set-{s.key}" for g in groups for s in g.settings}
    assert {k: v for k, v in cm["data"].items() if k in expected} == expected


def test_admission_auto_takes_the_policies_where_the_api_server_serves_them(helm: Path) -> None:
    served = rendered(helm, {}, "--api-versions", MAP_API)
    kinds = {o["kind"] for o in served}
    assert "MutatingAdmissionPolicy" in kinds
    assert "MutatingWebhookConfiguration" not in kinds
    # The webhook as a Deployment keeps the webhook, even where the policies are served.
    deployment = rendered(helm, {"webhook": {"deployment": True}}, "--api-versions", MAP_API)
    assert "MutatingWebhookConfiguration" in {o["kind"] for o in deployment}
    assert "MutatingAdmissionPolicy" not in {o["kind"] for o in deployment}


def test_admission_auto_takes_the_webhook_on_an_older_api_server(helm: Path) -> None:
    older = rendered(helm, {}, "--kube-version", "1.35.0")
    kinds = {o["kind"] for o in older}
    if "MutatingAdmissionPolicy" in kinds:
        pytest.fail(
            "Helm's built-in API versions include MutatingAdmissionPolicy v1: auto cannot tell"
        )
    assert "MutatingWebhookConfiguration" in kinds


@pytest.mark.parametrize(
    ("values", "namespace", "message"),
    [
        ({}, "default", "install into the namespace kn-rescheduler"),
        (
            {"admission": {"mode": "policies"}, "serving": {"enabled": False}},
            "kn-rescheduler",
            "admission.mode=policies needs Knative Serving's webhook",
        ),
        (
            {"admission": {"mode": "webhook"}, "webhook": {"networkPolicy": {"enabled": True}}},
            "kn-rescheduler",
            "webhook.networkPolicy.apiServerCIDR",
        ),
        (
            {"image": {"registry": REGISTRY, "digests": {"detect-failures": "latest"}}},
            "kn-rescheduler",
            "digests",
        ),
        ({"config": {"common": {"dryRnu": "true"}}}, "kn-rescheduler", "dryRnu"),
        ({"config": {"dryRun": "true"}}, "kn-rescheduler", "dryRun"),
        ({"config": {"rebalance": {"dryRun": "true"}}}, "kn-rescheduler", "dryRun"),
        ({"admission": {"mode": "always"}}, "kn-rescheduler", "admission"),
    ],
    ids=[
        "another namespace",
        "policies without serving",
        "network policy without its cidr",
        "a digest that is not one",
        "a misspelt setting",
        "a setting outside its group",
        "a setting in another function's group",
        "an unknown admission mode",
    ],
)
def test_values_a_user_can_get_wrong_are_refused_saying_which(
    helm: Path, values: dict[str, Any], namespace: str, message: str
) -> None:
    done = template(helm, values, namespace=namespace)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr
