"""shared.platform.senders: what a TokenReview's status says about who posted an event.

The statuses are shaped as kube-apiserver v1.36 answers a TokenReview (recorded from the local
control plane by tests/e2e/test_sender_authentication.py): a ServiceAccount token accepted for
the requested audience carries the user and the audiences; a refused one only ``error``.
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.platform.senders import audience_of, bearer, judge

AUDIENCE = audience_of("detect-failures")
NS = "kn-rescheduler"


def accepted(username: str, audiences: list[str] | None = None) -> dict[str, Any]:
    return {
        "authenticated": True,
        "user": {
            "username": username,
            "uid": "6f0c1d9e-0000-4000-8000-000000000001",
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{username.split(':')[2] if ':' in username else ''}",
                "system:authenticated",
            ],
        },
        "audiences": [AUDIENCE] if audiences is None else audiences,
    }


REFUSED = {"user": {}, "error": "[invalid bearer token, token lookup failed]"}
TRIGGER_SA = f"system:serviceaccount:{NS}:detect-failures-oidc-eventing.knative.dev-trigger"


@pytest.mark.parametrize(
    ("review", "status"),
    [
        (accepted(TRIGGER_SA), 200),  # Knative's token for the Trigger, for our audience
        (REFUSED, 401),  # forged, expired, or for an audience the API server would not accept
        (accepted(TRIGGER_SA, audiences=["https://kubernetes.default.svc"]), 401),
        (accepted("system:serviceaccount:shop:default"), 403),  # a pod of another namespace
        (accepted(f"system:serviceaccount:{NS}-evil:x"), 403),  # a lookalike namespace
        (accepted(f"system:serviceaccount:{NS}:"), 403),  # no name at all
        (accepted("jane@example.com"), 403),  # a person's OIDC login
    ],
)
def test_only_a_serviceaccount_of_our_namespace_with_our_audience_may_post(
    review: dict[str, Any], status: int
) -> None:
    verdict = judge(review, AUDIENCE, NS)
    assert verdict.allowed is (status == 200)
    assert verdict.status == status
    assert verdict.why


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc.def.ghi", "abc.def.ghi"),
        ("bearer   abc", "abc"),
        ("Basic dXNlcjpwYXNz", None),
        ("Bearer ", None),
        ("", None),
    ],
)
def test_the_bearer_token_is_read_from_the_authorization_header(
    header: str, token: str | None
) -> None:
    assert bearer({"Authorization": header} if header else {}) == token


def test_each_function_has_its_own_audience() -> None:
    assert audience_of("detect-failures") != audience_of("update-annotations")
