"""What the scale bench reads of a function's own /metrics is what the function serves: the
events it answered and its handler's time, through functions-framework as a Broker calls it."""

from __future__ import annotations

from dev.bench.common import delta, handling, parse_function_metrics
from shared.api.keys import APISERVER_UPDATE
from tests.handlers.conftest import ClientFactory, cloudevent
from tests.unit import pods


def test_the_events_a_function_answered_and_its_time_are_read_from_its_metrics(
    function_client: ClientFactory,
) -> None:
    client = function_client("detect-failures")
    # The process's counters outlive a test: the bench reads a window too.
    before = parse_function_metrics(client.get("/metrics").get_data(as_text=True))
    for _ in range(3):
        headers, body = cloudevent(APISERVER_UPDATE, pods.pod())
        assert client.post("/", headers=headers, data=body).status_code == 202
    headers, body = cloudevent(APISERVER_UPDATE, {"not": "a pod"})
    assert client.post("/", headers=headers, data=body).status_code == 400
    after = parse_function_metrics(client.get("/metrics").get_data(as_text=True))

    window = handling(delta(before, after), seconds=2.0)

    assert window["events"] == 4
    assert window["handled_per_s"] == 2.0
    # Every event that parsed as a CloudEvent was timed, the one its handler refused too.
    assert window["handled"] == 4
    assert window["handler_mean_s"] is not None and 0 < window["handler_mean_s"] < 5
    assert window["handler_p99_s_at_most"] is not None
