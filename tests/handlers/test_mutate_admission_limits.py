"""mutate-admission never reads a body it will not use: the request size limit, through
functions-framework (whose own after-request hook would otherwise read every body in full)."""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.handlers.conftest import ClientFactory
from tests.unit import pods

LIMIT_ENV = "KN_RESCHEDULER_WEBHOOK_MAX_BODY_BYTES"
MiB = 1024 * 1024


class Untouchable(io.RawIOBase):
    """A request body of ``size`` bytes that must never be read."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.position = 0
        self.reads = 0

    def readable(self) -> bool:
        return True

    # The test client measures the stream it is given; measuring is not reading.
    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.position = self.size if whence == io.SEEK_END else offset
        return self.position

    def tell(self) -> int:
        return self.position

    def readinto(self, buffer: Any) -> int:
        self.reads += 1
        raise AssertionError("the body of an oversized request was read")


def review(obj: Any) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": "shop",
            "object": obj,
        },
    }


@contextlib.contextmanager
def warnings_logged() -> Iterator[list[logging.LogRecord]]:
    """Warnings logged inside the block (a handler added after the function's own log
    set-up, which replaces the root logger's handlers)."""

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            kept.append(record)

    kept: list[logging.LogRecord] = []
    handler = Keep(logging.WARNING)
    logging.getLogger().addHandler(handler)
    try:
        yield kept
    finally:
        logging.getLogger().removeHandler(handler)


def test_a_body_declared_over_3_mib_is_refused_with_413_without_reading_it(
    function_client: ClientFactory,
    unreachable_kubeconfig: Path,
) -> None:
    client = function_client("mutate-admission", KUBECONFIG=str(unreachable_kubeconfig))
    declared = 3 * MiB + 1
    body = Untouchable(declared)
    with warnings_logged() as logged:
        response = client.post("/", input_stream=body, content_type="application/json")
    assert response.status_code == 413
    assert body.reads == 0
    error = response.get_json()["error"]
    assert (
        f"{declared} bytes" in error and f"{3 * MiB} bytes" in error and "MAX_BODY_BYTES" in error
    )
    (record,) = [r for r in logged if "too large" in r.getMessage()]
    assert record.bytes == declared  # type: ignore[attr-defined]


def test_a_pod_near_etcds_object_limit_is_still_answered(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    # 1.4 MiB of annotations: a pod etcd still stores (its limit is 1.5 MiB per request).
    big = pods.pod(owner=None, node=None, stamp=None, annotations={"notes": "x" * (1450 * 1024)})
    payload = json.dumps(review(big)).encode()
    assert 1.4 * MiB < len(payload) < 3 * MiB
    client = function_client("mutate-admission", KUBECONFIG=str(unreachable_kubeconfig))
    response = client.post("/", data=payload, content_type="application/json")
    assert response.status_code == 200
    assert response.get_json()["response"]["allowed"] is True


def test_the_limit_is_a_setting_and_a_bad_value_stops_the_function(
    function_client: ClientFactory, unreachable_kubeconfig: Path
) -> None:
    client = function_client(
        "mutate-admission", KUBECONFIG=str(unreachable_kubeconfig), **{LIMIT_ENV: "1024"}
    )
    payload = json.dumps(review(pods.pod(owner=None, node=None, stamp=None))).encode()
    assert len(payload) > 1024
    assert client.post("/", data=payload, content_type="application/json").status_code == 413
    with pytest.raises(Exception, match=LIMIT_ENV):
        function_client("mutate-admission", **{LIMIT_ENV: "3MiB"})
