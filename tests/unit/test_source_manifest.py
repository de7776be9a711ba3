"""The local adapter watches what the shipped ApiServerSource watches: read from the manifest and
translated as Knative's controller translates it (receive_adapter.go), label selector included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dev.pipeline.source import (
    MANIFEST,
    ApiServerSource,
    SourceError,
    from_manifest,
    guess_resource,
    selector_string,
)
from shared.api.keys import DEFAULT_NAMESPACE, OPTED_IN_LABEL, OPTED_IN_VALUE


def test_the_shipped_source_watches_only_pods_the_webhook_labelled_in_every_namespace() -> None:
    spec = from_manifest(MANIFEST)
    assert spec.resources == ("v1/pods",)
    # The same key and value the webhook writes (shared.admission.decide), or no pod would ever
    # match.
    assert spec.label_selector == f"{OPTED_IN_LABEL}={OPTED_IN_VALUE}"
    assert spec.namespaces == ()
    assert spec.mode == "Resource"


def test_the_adapter_gets_the_selector_in_its_source_config() -> None:
    source = ApiServerSource.from_manifest("kubeconfig", "http://127.0.0.1:1/ns/default")
    assert source.config == {
        "namespaces": [],
        "allNamespaces": True,
        "resources": [
            {
                "gvr": {"Group": "", "Version": "v1", "Resource": "pods"},
                "selector": "kn-rescheduler.io/opted-in=true",
            }
        ],
        "mode": "Resource",
    }
    assert (source.name, source.namespace) == ("pod-events", DEFAULT_NAMESPACE)


# apimachinery's LabelSelectorAsSelector(...).String(): requirements sorted by key, the values of
# in/notin sorted, "!" for DoesNotExist, nothing for an absent or empty selector.
SELECTORS: dict[str, tuple[Any, str]] = {
    "absent": (None, ""),
    "empty: everything": ({}, ""),
    "one label": (
        {"matchLabels": {"kn-rescheduler.io/opted-in": "true"}},
        "kn-rescheduler.io/opted-in=true",
    ),
    "labels sorted by key": ({"matchLabels": {"tier": "web", "app": "shop"}}, "app=shop,tier=web"),
    "every operator": (
        {
            "matchLabels": {"b": "1"},
            "matchExpressions": [
                {"key": "d", "operator": "NotIn", "values": ["y", "x"]},
                {"key": "c", "operator": "In", "values": ["z"]},
                {"key": "aa", "operator": "DoesNotExist"},
                {"key": "a", "operator": "Exists"},
            ],
        },
        "a,!aa,b=1,c in (z),d notin (x,y)",
    ),
}


@pytest.mark.parametrize("case", SELECTORS.values(), ids=SELECTORS.keys())
def test_a_label_selector_becomes_the_string_the_controller_gives_the_adapter(
    case: tuple[Any, str],
) -> None:
    selector, expected = case
    assert selector_string(selector) == expected


@pytest.mark.parametrize(
    "expression",
    [
        {"key": "a", "operator": "Equals", "values": ["x"]},
        {"key": "a", "operator": "In", "values": []},
        {"key": "a", "operator": "Exists", "values": ["x"]},
        {"operator": "Exists"},
    ],
)
def test_a_selector_the_api_would_refuse_is_an_error(expression: dict[str, Any]) -> None:
    with pytest.raises(SourceError):
        selector_string({"matchExpressions": [expression]})


@pytest.mark.parametrize(
    ("api_version", "kind", "resource"),
    [
        ("v1", "Pod", "v1/pods"),
        ("v1", "Endpoints", "v1/endpoints"),
        ("networking.k8s.io/v1", "Ingress", "networking.k8s.io/v1/ingresses"),
        ("networking.k8s.io/v1", "NetworkPolicy", "networking.k8s.io/v1/networkpolicies"),
        ("apps/v1", "Deployment", "apps/v1/deployments"),
    ],
)
def test_kinds_are_pluralised_as_the_controller_guesses(
    api_version: str, kind: str, resource: str
) -> None:
    assert guess_resource(api_version, kind) == resource


def source_yaml(spec: str) -> str:
    return (
        "apiVersion: sources.knative.dev/v1\nkind: ApiServerSource\n"
        "metadata: {name: s, namespace: team}\nspec:\n" + spec
    )


def test_without_a_namespace_selector_the_source_watches_its_own_namespace(
    tmp_path: Path,
) -> None:
    manifest = tmp_path / "sources.yaml"
    manifest.write_text(source_yaml("  resources: [{apiVersion: v1, kind: Pod}]\n"))
    spec = from_manifest(manifest, "s")
    assert spec.namespaces == ("team",)
    assert spec.label_selector == ""
    assert spec.mode == "Reference"  # the API's default


@pytest.mark.parametrize(
    "spec",
    [
        "  namespaceSelector: {matchLabels: {team: a}}\n"
        "  resources: [{apiVersion: v1, kind: Pod}]\n",
        "  resources: [{apiVersion: v1, kind: Pod, selector: {matchLabels: {a: b}}},"
        " {apiVersion: v1, kind: Service}]\n",
        "  resources: []\n",
    ],
    ids=["a namespace selector with labels", "a selector per resource", "no resources"],
)
def test_what_the_local_adapter_cannot_reproduce_is_refused(tmp_path: Path, spec: str) -> None:
    manifest = tmp_path / "sources.yaml"
    manifest.write_text(source_yaml(spec))
    with pytest.raises(SourceError):
        from_manifest(manifest, "s")
