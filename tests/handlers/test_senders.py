"""Every event function, with KN_RESCHEDULER_SENDER_AUTH=require, through its entry point.

No token: 401 with a Bearer challenge, without asking the API server (it is unreachable
here). A token while the API server cannot review it: 503, which Knative redelivers. The
review itself, on the real API server: tests/e2e/test_sender_authentication.py.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from shared.api.keys import PING_EVENT_TYPE
from shared.platform.senders import audience_of
from tests.builders import jwt
from tests.handlers.conftest import ClientFactory, cloudevent, settings

EVENT_FUNCTIONS = (
    "detect-failures",
    "update-annotations",
    "sweep-failures",
    "assess-nodes",
    "label-nodes",
    "annotate-usage",
    "rebalance-nodes",
)


@pytest.mark.parametrize("name", EVENT_FUNCTIONS)
def test_an_event_without_a_token_is_refused_401_and_one_that_cannot_be_reviewed_503(
    name: str, function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client(
        name, **settings(name, unreachable_kubeconfig, KN_RESCHEDULER_SENDER_AUTH="require")
    )
    headers, body = cloudevent(PING_EVENT_TYPE, {})
    anonymous = client.post("/", headers=headers, data=body)
    assert anonymous.status_code == 401
    assert anonymous.headers["WWW-Authenticate"] == 'Bearer realm="kn-rescheduler"'
    assert "bearer token" in anonymous.get_json()["error"]

    # A token shaped for this function's audience: only the API server can judge it.
    token = jwt(aud=[audience_of(name)], exp=time.time() + 600)
    unreviewed = client.post(
        "/", headers={**headers, "Authorization": f"Bearer {token}"}, data=body
    )
    assert unreviewed.status_code == 503


def test_a_pod_without_a_token_of_its_own_answers_500_and_says_why_instead_of_crashing(
    function_client: ClientFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """In a pod whose ServiceAccount mounts no token (detect-failures' in the base), the API
    server cannot be asked: the in-cluster configuration finds no token file. Seen on the
    installed cluster before the component mounted one: every event was a 500 traceback. Now
    a 500 that says "needs a person" (no redelivery fixes it), and an error line in the log."""
    if Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists():
        pytest.skip("this machine is a pod with a token of its own")
    client = function_client(
        "detect-failures",
        KUBERNETES_SERVICE_HOST="127.0.0.1",
        KUBERNETES_SERVICE_PORT="9",
        KN_RESCHEDULER_SENDER_AUTH="require",
    )
    headers, body = cloudevent(PING_EVENT_TYPE, {})
    token = jwt(aud=[audience_of("detect-failures")], exp=time.time() + 600)
    caplog.set_level("ERROR", logger="shared.platform.senders")
    logging.getLogger("shared.platform.senders").addHandler(caplog.handler)
    answer = client.post("/", headers={**headers, "Authorization": f"Bearer {token}"}, data=body)
    assert answer.status_code == 500
    assert "Traceback" not in answer.get_data(as_text=True)
    said = {r.getMessage() for r in caplog.records if r.levelname == "ERROR"}
    assert any("no credentials for the API server" in m for m in said), said


def test_a_typo_in_the_setting_stops_the_function_at_start_up(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    with pytest.raises(Exception, match="KN_RESCHEDULER_SENDER_AUTH"):
        function_client(
            "detect-failures",
            KUBECONFIG=str(unreachable_kubeconfig),
            KN_RESCHEDULER_SENDER_AUTH="required",
        )
