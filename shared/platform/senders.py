"""Who may post events to a function: Knative's sender authentication, verified here.

Any pod that reaches a function's cluster-local Service can post it a CloudEvent. With
Knative Eventing's ``authentication-oidc`` feature on, Eventing attaches to every delivery an
OIDC token of the sender's own ServiceAccount (a Trigger's or a source's, which Eventing creates
in the Trigger's namespace: ``<name>-oidc-eventing.knative.dev-trigger``), issued by the API
server for the audience the destination names (``audience`` on the Trigger's subscriber, the
source's sink). With ``KN_RESCHEDULER_SENDER_AUTH=require`` (the ``sender-authentication``
component), a function answers:

- 401 to a request without a bearer token, or with one the API server does not accept for this
  function's audience (``kn-rescheduler/<function>``): expired, forged, for another audience;
- 403 to a token the API server accepts for that audience whose bearer is not a ServiceAccount
  of kn-rescheduler's own namespace: a pod elsewhere can get a token for any audience, only
  Knative (and whoever may already create ServiceAccount tokens there) mints one as ours;
- 503 when the API server cannot be asked (a redelivery will be).

The API server judges the token (a TokenReview, the ``system:auth-delegator`` way): no keys to
fetch and rotate, no JWT library. Verdicts are kept for a minute per token (by its hash), so a
burst of events costs one review. Neither 401 nor 403 is retried by Knative: the event goes to
the dead-letter sink, where a misconfiguration shows.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from shared.platform import kube

log = logging.getLogger(__name__)

AUDIENCE_PREFIX: Final = "kn-rescheduler/"
REMEMBER_SECONDS: Final = 60.0
REMEMBER_MAX: Final = 1024


def audience_of(function: str) -> str:
    """The audience a function's senders must request their token for."""
    return AUDIENCE_PREFIX + function


@dataclass(frozen=True)
class SenderVerdict:
    """Whether the request may be handled; the HTTP status and reason when not."""

    allowed: bool
    status: int = 200
    why: str = ""


def bearer(headers: Mapping[str, str]) -> str | None:
    """The token of an ``Authorization: Bearer`` header, or None."""
    value = headers.get("Authorization") or headers.get("authorization") or ""
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def judge(review: Mapping[str, Any], audience: str, namespace: str) -> SenderVerdict:
    """What a TokenReview's status says about a sender (pure)."""
    if not review.get("authenticated"):
        error = str(review.get("error") or "the API server did not accept the token")
        return SenderVerdict(False, 401, f"not authenticated for {audience}: {error}")
    audiences = review.get("audiences") or []
    if audience not in audiences:
        # An API server that ignores the requested audiences answers with its own (or none).
        return SenderVerdict(False, 401, f"the token is not for {audience} (it is for {audiences})")
    username = str((review.get("user") or {}).get("username") or "")
    ours = f"system:serviceaccount:{namespace}:"
    if not username.startswith(ours) or len(username) == len(ours):
        return SenderVerdict(
            False, 403, f"{username or 'an unnamed user'} is not a ServiceAccount of {namespace}"
        )
    return SenderVerdict(True, why=username)


class Senders:
    """The check of one function's senders (``required`` False: every request is handled)."""

    def __init__(
        self,
        function: str,
        namespace: str,
        *,
        required: bool,
        api: Callable[[], kube.Kube],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.audience = audience_of(function)
        self.namespace = namespace
        self.required = required
        self._api = api
        self._client: kube.Kube | None = None
        self._clock = clock
        self._known: dict[str, tuple[float, SenderVerdict]] = {}
        self._lock = threading.Lock()

    def check(self, headers: Mapping[str, str]) -> SenderVerdict:
        if not self.required:
            return SenderVerdict(True)
        token = bearer(headers)
        if token is None:
            return SenderVerdict(False, 401, f"no bearer token (audience {self.audience})")
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        with self._lock:
            known = self._known.get(key)
        if known is not None and now - known[0] < REMEMBER_SECONDS:
            return known[1]
        try:
            if self._client is None:
                self._client = self._api()
            review = self._client.review_token(token, [self.audience])
        except kube.KubeError as exc:
            log.warning("cannot review a sender's token: %s", exc)
            return SenderVerdict(False, 503, "the API server could not review the token")
        verdict = judge(review, self.audience, self.namespace)
        with self._lock:
            if len(self._known) >= REMEMBER_MAX:
                self._known.clear()
            self._known[key] = (now, verdict)
        return verdict
