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
fetch and rotate, no JWT library. What is not a JWT for this audience, or has expired by its own
claims, is refused without asking (junk costs the API server nothing). A verdict is kept per
token (by its hash) for a minute or until the token expires, whichever is sooner, so a burst of
events costs one review; a refusal for an authenticator's error is never kept. Neither 401 nor
403 is retried by Knative: the event goes to the dead-letter sink, where a misconfiguration
shows.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from shared.platform import kube
from shared.platform.config import Config

log = logging.getLogger(__name__)

AUDIENCE_PREFIX: Final = "kn-rescheduler/"
REMEMBER_SECONDS: Final = 60.0
REMEMBER_MAX: Final = 1024


# Where a function that posts to the Broker (sweep-failures) finds its own token for the
# Broker's audience: a projected ServiceAccount token the kubelet writes and rotates
# (knative/sweep-failures.yaml). With Eventing's OIDC on, the Broker's ingress asks every
# sender for one and an EventPolicy names who may send; with it off, the header is ignored.
SINK_TOKEN_PATH: Final = "/var/run/secrets/kn-rescheduler/sink/token"


# A JWT is base64url segments and dots; a projected token is about a kilobyte. Anything else
# is not sent: a stray character would make the HTTP library raise an error quoting the header,
# token and all, into the log.
SINK_TOKEN_MAX: Final = 16384
_JWT_CHARS: Final = re.compile(r"[A-Za-z0-9._-]+")


def sink_token(path: str = SINK_TOKEN_PATH) -> Callable[[], str | None]:
    """A reader of the token at ``path``, read again for every post (the kubelet replaces the
    file before the token expires); None when there is none (not mounted, or empty) or when the
    file holds something that is not a token (logged, without its content)."""

    def read() -> str | None:
        try:
            with open(path, "rb") as f:
                raw = f.read(SINK_TOKEN_MAX + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("could not read the sink token %s: %s; posting without it", path, exc)
            return None
        token = raw.strip()
        if not token:
            return None
        if len(raw) > SINK_TOKEN_MAX or not _JWT_CHARS.fullmatch(token.decode("latin-1")):
            log.warning("the sink token %s is not a token; posting without it", path)
            return None
        return token.decode("ascii")

    return read


def audience_of(function: str) -> str:
    """The audience a function's senders must request their token for."""
    return AUDIENCE_PREFIX + function


@dataclass(frozen=True)
class SenderVerdict:
    """Whether the request may be handled; the HTTP status and reason when not."""

    allowed: bool
    status: int = 200
    why: str = ""
    # Whether the verdict may be remembered for the same token.
    cache: bool = True


def bearer(headers: Mapping[str, str]) -> str | None:
    """The token of an ``Authorization: Bearer`` header, or None."""
    value = headers.get("Authorization") or headers.get("authorization") or ""
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def claims(token: str) -> Mapping[str, Any] | None:
    """The payload of a JWT, read without verifying it (None: not a JWT). Only ever used to
    refuse early or to remember a verdict for less time; the API server decides the rest."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, UnicodeDecodeError):
        return None
    return payload if isinstance(payload, dict) else None


def precheck(token: str, audience: str, now: float) -> SenderVerdict | None:
    """A refusal that needs no TokenReview (pure): not a JWT, not for this audience, expired.
    None: ask the API server. Junk tokens then cost the API server nothing."""
    payload = claims(token)
    if payload is None:
        return SenderVerdict(False, 401, "not a JWT", cache=False)
    aud = payload.get("aud")
    audiences = aud if isinstance(aud, list) else [aud]
    if audience not in audiences:
        return SenderVerdict(False, 401, f"not a token for {audience}", cache=False)
    exp = payload.get("exp")
    if isinstance(exp, int | float) and exp <= now:
        return SenderVerdict(False, 401, "the token has expired", cache=False)
    return None


def judge(review: Mapping[str, Any], audience: str, namespace: str) -> SenderVerdict:
    """What a TokenReview's status says about a sender (pure)."""
    if not review.get("authenticated"):
        # Not remembered: an authenticator's passing error must not refuse Knative's next
        # delivery with the same token (a 401 is not retried: it would be a dead letter).
        error = str(review.get("error") or "the API server did not accept the token")
        return SenderVerdict(False, 401, f"not authenticated for {audience}: {error}", cache=False)
    audiences = review.get("audiences") or []
    if audience not in audiences:
        # An API server that ignores the requested audiences answers with its own (or none).
        return SenderVerdict(False, 401, f"the token is not for {audience} (it is for {audiences})")
    user = review.get("user") or {}
    username = str(user.get("username") or "")
    ours = f"system:serviceaccount:{namespace}:"
    name = username[len(ours) :] if username.startswith(ours) else ""
    # Exactly one ServiceAccount name after the prefix, and the group only the ServiceAccount
    # authenticator gives (another authenticator could name a user like one).
    groups = user.get("groups") or []
    if not name or ":" in name or f"system:serviceaccounts:{namespace}" not in groups:
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
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.audience = audience_of(function)
        self.namespace = namespace
        self.required = required
        self._api = api
        self._client: kube.Kube | None = None
        self._clock = clock
        self._wall = wall
        self._known: dict[str, tuple[float, SenderVerdict]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, function: str, config: Config) -> Senders:
        """A function's check as its settings say (KN_RESCHEDULER_SENDER_AUTH), reviewing with
        its own credentials, built when the first token comes. Says at start which protection
        is active, so that a reader of the log need not infer it from the settings."""
        required = config.sender_auth == "require"
        if required:
            log.info(
                "sender authentication on: only a Knative OIDC token for audience %s, of a "
                "ServiceAccount of namespace %s, is let in (TokenReview)",
                audience_of(function),
                config.namespace,
            )
        else:
            log.info(
                "sender authentication off (KN_RESCHEDULER_SENDER_AUTH=off): whoever reaches "
                "this function is heard; the NetworkPolicy event-functions-from-knative limits "
                "who reaches it where the cluster enforces NetworkPolicies"
            )
        return cls(function, config.namespace, required=required, api=kube.Kube.from_environment)

    def check(self, headers: Mapping[str, str]) -> SenderVerdict:
        if not self.required:
            return SenderVerdict(True)
        token = bearer(headers)
        if token is None:
            return SenderVerdict(False, 401, f"no bearer token (audience {self.audience})")
        early = precheck(token, self.audience, self._wall())
        if early is not None:
            return early
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        with self._lock:
            known = self._known.get(key)
        if known is not None and now < known[0]:
            return known[1]
        try:
            if self._client is None:
                self._client = self._api()
            review = self._client.review_token(token, [self.audience])
        except kube.Unconfigured as exc:
            # No token of its own to ask with: a deployment error no redelivery fixes.
            log.error("cannot review a sender's token, needs a person: %s", exc)
            return SenderVerdict(False, 500, "this function cannot ask the API server")
        except kube.KubeError as exc:
            log.warning("cannot review a sender's token: %s", exc)
            return SenderVerdict(False, 503, "the API server could not review the token")
        verdict = judge(review, self.audience, self.namespace)
        if verdict.cache:
            # Until a minute from now or the token's expiry, whichever comes first.
            exp = (claims(token) or {}).get("exp")
            left = exp - self._wall() if isinstance(exp, int | float) else REMEMBER_SECONDS
            with self._lock:
                if len(self._known) >= REMEMBER_MAX:
                    self._prune(now)
                self._known[key] = (now + min(REMEMBER_SECONDS, left), verdict)
        return verdict

    def _prune(self, now: float) -> None:
        """Drop what has expired; if the table is still full, the oldest half."""
        self._known = {k: v for k, v in self._known.items() if v[0] > now}
        if len(self._known) >= REMEMBER_MAX:
            keep = sorted(self._known.items(), key=lambda kv: kv[1][0])[REMEMBER_MAX // 2 :]
            self._known = dict(keep)
