"""shared.platform.senders: what a TokenReview's status says about who posted an event.

The statuses are shaped as kube-apiserver v1.36 answers a TokenReview (recorded from the local
control plane by tests/e2e/test_sender_authentication.py): a ServiceAccount token accepted for
the requested audience carries the user and the audiences; a refused one only ``error``.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from shared.platform.config import Config
from shared.platform.senders import Senders, audience_of, bearer, judge, precheck
from tests.builders import jwt

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
        (accepted(f"system:serviceaccount:{NS}:a:b"), 403),  # one name, no more segments
        # A user named like our ServiceAccount by another authenticator: no such group.
        ({**accepted(TRIGGER_SA), "user": {"username": TRIGGER_SA, "groups": []}}, 403),
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


NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("token", "refused"),
    [
        ("not-a-token", True),
        ("a.b.c", True),  # three parts, no JSON
        (jwt(aud=["https://kubernetes.default.svc"], exp=NOW + 600), True),
        (jwt(aud=[AUDIENCE], exp=NOW - 1), True),  # expired by its own claim
        (jwt(aud=[AUDIENCE], exp=NOW + 600), False),  # the API server decides
        (jwt(aud=AUDIENCE), False),  # aud as a single string
    ],
)
def test_junk_is_refused_without_asking_the_api_server(token: str, refused: bool) -> None:
    verdict = precheck(token, AUDIENCE, NOW)
    assert (verdict is not None) is refused
    if verdict is not None:
        assert verdict.status == 401 and not verdict.cache


class Reviews:
    """The TokenReview answers of a scripted API server, counted."""

    def __init__(self, *answers: dict[str, Any]) -> None:
        self.answers = list(answers)
        self.asked = 0

    def review_token(self, token: str, audiences: list[str]) -> dict[str, Any]:
        self.asked += 1
        return self.answers.pop(0)


def test_a_verdict_is_remembered_until_the_token_expires_and_an_error_never() -> None:
    clock = [100.0]
    reviews = Reviews(REFUSED, accepted(TRIGGER_SA), accepted(TRIGGER_SA))
    senders = Senders(
        "detect-failures",
        NS,
        required=True,
        api=lambda: reviews,  # type: ignore[arg-type,return-value]
        clock=lambda: clock[0],
        wall=lambda: NOW + clock[0] - 100.0,
    )
    token = {"Authorization": "Bearer " + jwt(aud=[AUDIENCE], exp=NOW + 20)}
    assert senders.check(token).status == 401  # an authenticator's hiccup...
    assert senders.check(token).allowed  # ...is not remembered: asked again
    clock[0] += 19
    assert senders.check(token).allowed  # remembered
    assert reviews.asked == 2
    clock[0] += 2  # past the token's own expiry (20 s), well before a minute
    assert senders.check(token).status == 401  # refused by its claim, without a review
    assert reviews.asked == 2


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ("require", "sender authentication on: only a Knative OIDC token for audience "
         "kn-rescheduler/detect-failures"),
        ("off", "sender authentication off (KN_RESCHEDULER_SENDER_AUTH=off)"),
    ],
)  # fmt: skip
def test_each_function_says_at_start_which_protection_is_active(
    setting: str, said: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="shared.platform.senders")
    logging.getLogger("shared.platform.senders").addHandler(caplog.handler)
    senders = Senders.from_config("detect-failures", Config(sender_auth=setting))
    assert senders.required is (setting == "require")
    assert any(said in r.getMessage() for r in caplog.records), caplog.records
