"""knative/components/sender-authentication on the real API server: only Knative may post.

detect-failures runs with the component's settings and with its own ServiceAccount's token
(the component's RBAC: create tokenreviews, nothing more). Tokens come from the TokenRequest
API, as Knative Eventing's OIDC token provider gets them for a Trigger's ServiceAccount
(knative.dev/eventing pkg/auth/token_provider.go: the audience the subscriber names). The
real kube-apiserver reviews each: the Trigger's token for the function's audience is let in;
no token, a token for another audience, and a pod's token from another namespace are not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from shared.api.keys import APISERVER_ADD
from shared.platform.kube import Kube
from shared.platform.senders import audience_of
from tests import builders
from tests.e2e.knative_manifests import (
    NAMESPACE,
    Obj,
    install_rbac,
    kubeconfig_for,
    render,
    service_account_token,
)
from tests.handlers.conftest import ClientFactory, cloudevent

pytestmark = pytest.mark.e2e

FUNCTION = "detect-failures"
AUDIENCE = audience_of(FUNCTION)
# The name Eventing gives a Trigger's OIDC ServiceAccount (pkg/auth/serviceaccount.go).
TRIGGER_SA = f"{FUNCTION}-oidc-eventing.knative.dev-trigger"


@pytest.fixture(scope="module")
def rendered(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    objs = render("sender-authentication", workdir=tmp_path_factory.mktemp("overlay-senders"))
    install_rbac(cluster.kubeconfig, objs)
    return objs


def token_for(api: k8s.ApiClient, name: str, namespace: str, audience: str) -> str:
    core = k8s.CoreV1Api(api)
    try:
        core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    except k8s.ApiException as exc:
        if exc.status != 409:
            raise
    spec = k8s.V1TokenRequestSpec(audiences=[audience], expiration_seconds=600)
    answer = core.create_namespaced_service_account_token(
        name, namespace, k8s.AuthenticationV1TokenRequest(spec=spec)
    )
    token: str = answer.status.token
    return token


def test_only_knatives_token_for_the_functions_audience_is_let_in(
    cluster: Any,
    api: Kube,
    namespace: str,
    rendered: list[Obj],
    function_client: ClientFactory,
    tmp_path: Path,
) -> None:
    env = [o for o in rendered if o["kind"] == "ConfigMap" and "config" in o["metadata"]["name"]]
    assert any(c["data"].get("KN_RESCHEDULER_SENDER_AUTH") == "require" for c in env)
    own = service_account_token(cluster.api_client(), FUNCTION)
    kubeconfig = kubeconfig_for(cluster.server, cluster.ca_file, own, tmp_path / "kubeconfig")
    client = function_client(
        FUNCTION, KUBECONFIG=str(kubeconfig), KN_RESCHEDULER_SENDER_AUTH="require"
    )
    # A pod as the API server returns it (what an ApiServerSource sends), not opted in.
    pod = api.create("Pod", namespace, builders.bare_pod("quiet"))
    headers, body = cloudevent(APISERVER_ADD, pod)

    def post(token: str | None) -> Any:
        auth = {"Authorization": f"Bearer {token}"} if token is not None else {}
        return client.post("/", headers={**headers, **auth}, data=body)

    knative = token_for(cluster.api_client(), TRIGGER_SA, NAMESPACE, AUDIENCE)
    assert post(knative).status_code == 202  # handled: a pod that is not opted in

    no_token = post(None)
    assert no_token.status_code == 401
    assert no_token.headers["WWW-Authenticate"].startswith("Bearer")
    assert post("not-a-token").status_code == 401
    # Knative's own ServiceAccount, but a token for the API server, not for this function.
    other_audience = token_for(
        cluster.api_client(), TRIGGER_SA, NAMESPACE, "https://kubernetes.default.svc"
    )
    assert post(other_audience).status_code == 401
    # Another function's audience: a token for update-annotations is no good here.
    sideways = token_for(
        cluster.api_client(), TRIGGER_SA, NAMESPACE, audience_of("update-annotations")
    )
    assert post(sideways).status_code == 401
    # Any pod can get a token of its own ServiceAccount for any audience (a projected volume):
    # the right audience from another namespace is refused.
    stranger = token_for(cluster.api_client(), "default", namespace, AUDIENCE)
    refused = post(stranger)
    assert refused.status_code == 403
    assert "not a ServiceAccount" not in refused.get_data(as_text=True)  # says no more than no
