"""The plugin's ``explain`` against detect-failures itself, as functions-framework serves it.

Each pod real kubelets wrote (tests/fixtures/real-kubelet/, stamped opted in) is posted to the
function as ApiServerSource posts a pod update, and judged by ``explain`` at the same moment
with the same (default) settings: the failure the function answers with, or its 202, is the
verdict the plugin says, kind and reason and node alike.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from kubectl_kn_rescheduler import explain
from shared.api.keys import APISERVER_UPDATE, EVENT_POD_FAILING
from shared.platform.config import Config
from tests.handlers.conftest import ClientFactory, cloudevent, reply_of
from tests.unit.test_plugin_explain import stamped
from tests.unit.test_real_kubelet_statuses import EXPECTED


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
def test_explain_says_what_detect_failures_answers(
    function_client: ClientFactory, scenario: str
) -> None:
    pod = stamped(scenario)
    meta = pod["metadata"]
    headers, body = cloudevent(
        APISERVER_UPDATE,
        pod,
        subject=f"/apis/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
        kind="Pod",
    )
    response = function_client("detect-failures").post("/", headers=headers, data=body)
    detected, _ = explain.judge(stamped(scenario), Config(), datetime.now(UTC))
    if response.status_code == 202:
        assert detected.failing is None, detected.why
        return
    assert response.status_code == 200
    attrs, data = reply_of(response)
    assert attrs["type"] == EVENT_POD_FAILING
    assert detected.failing is not None
    assert (detected.kind, detected.reason, detected.failing.failure.node) == (
        data["kind"],
        data["reason"],
        data["node"],
    )
