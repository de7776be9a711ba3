"""The one module that talks to the Kubernetes API.

Everything else builds request bodies (pure code) and hands them here. Keeping the client in
one place means one set of timeouts, one error vocabulary and one dry-run switch:

- API errors map to a handful of exceptions of ours (NotFound, Conflict, AlreadyExists,
  Forbidden, Invalid, Transient, DisruptionBudgetRefused, and Gone for a watch too far
  behind), so handlers decide on meaning, not on HTTP codes;
- only Transient failures (429, 5xx, timeouts, refused connections) are retried here, with a
  short bounded backoff; the handler's caller (Knative's redelivery) owns longer waits. A
  PodDisruptionBudget's refusal is a 429 too, but not retried here: a budget changes when pods
  become Ready, in minutes, not in the milliseconds a retry waits;
- with ``dry_run`` every write carries ``dryRun=All``: the API server validates and admits it
  (webhooks included) but persists nothing;
- every call is recorded in the current ``recording()`` context, which the replay tool prints
  as the decision trace.

Objects travel as plain JSON dicts (the API's own camelCase form), not the client's generated
models: the same shape the CloudEvents and AdmissionReviews carry.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import random
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote, urlencode

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from shared.api.keys import COMPONENT

log = logging.getLogger(__name__)

JSON = dict[str, Any]

# The StatusCause type the Eviction API puts on a 429 caused by a PodDisruptionBudget
# (policyv1.DisruptionBudgetCause).
DISRUPTION_BUDGET_CAUSE: Final = "DisruptionBudget"

# kind -> (API path prefix, plural). Only the kinds the project reads or writes.
RESOURCES: Final[Mapping[str, tuple[str, str]]] = {
    "Pod": ("/api/v1", "pods"),
    "Event": ("/api/v1", "events"),
    "ReplicaSet": ("/apis/apps/v1", "replicasets"),
    "Deployment": ("/apis/apps/v1", "deployments"),
    "StatefulSet": ("/apis/apps/v1", "statefulsets"),
    "DaemonSet": ("/apis/apps/v1", "daemonsets"),
    "Job": ("/apis/batch/v1", "jobs"),
    "CronJob": ("/apis/batch/v1", "cronjobs"),
    # Cluster-scoped: the node functions read and mark Nodes; the webhook reads a pod's
    # Namespace for the per-namespace pressure opt-in.
    "Node": ("/api/v1", "nodes"),
    "Namespace": ("/api/v1", "namespaces"),
    # rebalance-nodes reads the claims of the pods it would evict and their volumes (get only),
    # to keep a pod on the node its volume is bound to.
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims"),
    "PersistentVolume": ("/api/v1", "persistentvolumes"),
    # The settings the functions run with (knative/config.env), read by the kubectl plugin so
    # that it judges with the installed thresholds, not its own defaults.
    "ConfigMap": ("/api/v1", "configmaps"),
    # The plugin's replay routes recorded events as the Broker does, by the installed Triggers.
    "Trigger": ("/apis/eventing.knative.dev/v1", "triggers"),
    # The Metrics API (metrics-server, through the API server's aggregation layer): one
    # NodeMetrics per node, usage in cores and bytes ({"cpu": "1250m", "memory": "2Gi"}).
    "NodeMetrics": ("/apis/metrics.k8s.io/v1beta1", "nodes"),
}


class KubeError(Exception):
    """An API call failed; ``status`` is the HTTP status (0 when no answer came), ``reason``
    the Status reason and ``causes`` the messages of the Status's details.causes."""

    def __init__(
        self, message: str, status: int = 0, reason: str = "", causes: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.causes = causes


class NotFound(KubeError):
    """The object (or its namespace) does not exist."""


class Conflict(KubeError):
    """A precondition failed: stale resourceVersion or a uid that no longer matches."""


class AlreadyExists(Conflict):
    """A create found an object of that name."""


class Forbidden(KubeError):
    """RBAC said no. Not retried: a deployment problem, not a passing one."""


class Invalid(KubeError):
    """The API server rejected the request body (400/422) or another permanent 4xx."""


class Gone(KubeError):
    """410: a watch's resourceVersion is older than the API server keeps; list again."""


class Unconfigured(KubeError):
    """No credentials to reach the API server with (no ServiceAccount token mounted in the
    pod, no kubeconfig): a deployment problem, which no retry fixes."""


class Transient(KubeError):
    """Worth another try later: 429, 5xx, timeouts, connection failures."""


class DisruptionBudgetRefused(Transient):
    """The Eviction API said no because of a PodDisruptionBudget: "not now", not an error.

    The API server answers 429 with a ``DisruptionBudget`` cause (pkg/registry/core/pod/
    storage/eviction.go) when the budget allows no disruption, or when the disruption
    controller has not yet observed the budget's latest generation. ``causes`` holds its
    sentence, e.g. "The disruption budget web needs 1 healthy pods and has 1 currently".
    """


@dataclass(frozen=True)
class WatchEvent:
    """One line of a watch: ADDED, MODIFIED, DELETED or BOOKMARK, and the object (for a
    BOOKMARK, only its kind, apiVersion and metadata.resourceVersion)."""

    type: str
    object: JSON

    @property
    def resource_version(self) -> str:
        metadata = self.object.get("metadata")
        return str(metadata.get("resourceVersion") or "") if isinstance(metadata, dict) else ""


@dataclass(frozen=True)
class Call:
    """One API request as the decision trace shows it."""

    method: str
    path: str
    status: int
    dry_run: bool
    millis: float
    error: str = ""

    def describe(self) -> str:
        dry = " (dry run)" if self.dry_run else ""
        err = f" {self.error}" if self.error else ""
        return f"{self.method} {self.path} -> {self.status}{dry}{err}"


_recording: contextvars.ContextVar[list[Call] | None] = contextvars.ContextVar(
    "kube_recording", default=None
)


_forced_dry_run: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "kube_forced_dry_run", default=False
)


@contextlib.contextmanager
def forced_dry_run(enabled: bool = True) -> Iterator[None]:
    """Every write inside the block is a server-side dry run, whatever the client's switch
    (the replay tool's ``--dry-run``, carried to running functions by an event extension)."""
    token = _forced_dry_run.set(enabled or _forced_dry_run.get())
    try:
        yield
    finally:
        _forced_dry_run.reset(token)


@contextlib.contextmanager
def recording() -> Iterator[list[Call]]:
    """Collect the API calls made inside the block (per thread / context)."""
    calls: list[Call] = []
    token = _recording.set(calls)
    try:
        yield calls
    finally:
        _recording.reset(token)


def _error_for(status: int, body: bytes | str | None, what: str) -> KubeError:
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else (body or "")
    reason, message = "", text[:300]
    causes: list[dict[str, Any]] = []
    try:
        parsed = json.loads(text)
        reason = str(parsed.get("reason", ""))
        message = str(parsed.get("message", message))
        found = (parsed.get("details") or {}).get("causes") or []
        causes = [c for c in found if isinstance(c, dict)] if isinstance(found, list) else []
    except (ValueError, AttributeError):
        pass
    full = f"{what}: {status} {reason}: {message}".strip()
    # A StatusCause's type travels as "reason" in JSON (metav1.StatusCause).
    budget = [c for c in causes if c.get("reason") == DISRUPTION_BUDGET_CAUSE]
    if status == 429 and budget:
        said = tuple(str(c["message"]) for c in budget if c.get("message"))
        detail = f" ({'; '.join(said)})" if said else ""
        return DisruptionBudgetRefused(full + detail, status, reason, said)
    if status == 404:
        return NotFound(full, status, reason)
    if status == 409:
        cls = AlreadyExists if reason == "AlreadyExists" else Conflict
        return cls(full, status, reason)
    if status in (401, 403):
        return Forbidden(full, status, reason)
    if status == 410:
        return Gone(full, status, reason)
    if status == 429 or status >= 500:
        return Transient(full, status, reason)
    return Invalid(full, status, reason)


def _watch_event(line: bytes, what: str) -> WatchEvent:
    try:
        event = json.loads(line)
        kind, obj = event["type"], event["object"]
    except (ValueError, KeyError, TypeError) as exc:
        raise Transient(f"{what}: unreadable watch event: {line[:200]!r}") from exc
    if not isinstance(obj, dict):
        raise Transient(f"{what}: a watch event without an object: {line[:200]!r}")
    if kind == "ERROR":
        # metav1.Status: the code (410 for an expired resourceVersion) and its message.
        raise _error_for(int(obj.get("code") or 500), json.dumps(obj), what)
    return WatchEvent(str(kind), obj)


def path_for(kind: str, namespace: str | None, name: str | None = None, sub: str = "") -> str:
    try:
        prefix, plural = RESOURCES[kind]
    except KeyError:
        raise Invalid(f"kind {kind!r} is not one kn-rescheduler works with") from None
    parts = [prefix]
    if namespace:
        parts.append(f"namespaces/{quote(namespace, safe='')}")
    parts.append(plural)
    if name:
        parts.append(quote(name, safe=""))
    if sub:
        parts.append(sub)
    return "/".join(parts)


class Kube:
    """A thin, typed-error view of the API server. Thread-safe (urllib3 pools)."""

    def __init__(
        self,
        api_client: k8s_client.ApiClient,
        *,
        dry_run: bool = False,
        timeout: float = 5.0,
        attempts: int = 4,
        backoff: float = 0.1,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._api = api_client
        self.dry_run = dry_run
        self.timeout = timeout
        self.attempts = max(1, attempts)
        self.backoff = backoff
        self._sleep = sleep

    @classmethod
    def from_environment(
        cls,
        *,
        dry_run: bool = False,
        timeout: float = 5.0,
        attempts: int = 4,
        kubeconfig: str | None = None,
        context: str | None = None,
        client_retries: int | None = None,
    ) -> Kube:
        """In-cluster credentials when running in a pod, else $KUBECONFIG / ~/.kube/config.

        ``kubeconfig`` and ``context`` (the kubectl plugin's ``--kubeconfig`` and ``--context``)
        choose a file and a context in it, and always mean a kubeconfig, even in a pod.
        ``client_retries``: urllib3's own retries of a connection (None: its default, 3), below
        ``attempts``; the plugin asks for none, a person is waiting.
        """
        configuration = k8s_client.Configuration()
        try:
            if os.environ.get("KUBERNETES_SERVICE_HOST") and not (kubeconfig or context):
                k8s_config.load_incluster_config(client_configuration=configuration)
            else:
                # The client reads $KUBECONFIG once, at import; read it now instead.
                with _client_errors() as said:
                    k8s_config.load_kube_config(
                        config_file=kubeconfig or os.environ.get("KUBECONFIG") or None,
                        context=context,
                        client_configuration=configuration,
                    )
                # A kubeconfig user whose exec plugin (or auth provider) fails is only logged
                # by the client, which then goes on with no credentials at all: every call
                # would be made as system:anonymous and refused, or worse, allowed.
                if said and not _has_credentials(configuration):
                    raise Unconfigured(
                        "the kubeconfig's credentials could not be obtained: " + "; ".join(said)
                    )
        except (k8s_config.ConfigException, OSError) as exc:
            # A pod whose ServiceAccount mounts no token (automountServiceAccountToken: false)
            # has KUBERNETES_SERVICE_HOST but nothing to authenticate with.
            raise Unconfigured(f"no credentials for the API server: {exc}") from exc
        # Handlers run many threads (gunicorn gthread); the default pool of 4 makes them queue.
        configuration.connection_pool_maxsize = 32
        if client_retries is not None:
            configuration.retries = client_retries
        return cls(
            k8s_client.ApiClient(configuration),
            dry_run=dry_run,
            timeout=timeout,
            attempts=attempts,
        )

    @staticmethod
    def context_namespace(kubeconfig: str | None = None, context: str | None = None) -> str | None:
        """The namespace the kubeconfig's context names (what kubectl uses without ``-n``);
        None when it names none or there is no kubeconfig to read."""
        try:
            contexts, current = k8s_config.list_kube_config_contexts(
                config_file=kubeconfig or os.environ.get("KUBECONFIG") or None
            )
        except (k8s_config.ConfigException, OSError):
            return None
        chosen = next((c for c in contexts or () if c.get("name") == context), None)
        entry = (chosen if context else current) or {}
        namespace = (entry.get("context") or {}).get("namespace")
        return str(namespace) if namespace else None

    def with_options(self, *, dry_run: bool | None = None, timeout: float | None = None) -> Kube:
        """The same connection with another dry-run switch or timeout."""
        return Kube(
            self._api,
            dry_run=self.dry_run if dry_run is None else dry_run,
            timeout=self.timeout if timeout is None else timeout,
            attempts=self.attempts,
            backoff=self.backoff,
            sleep=self._sleep,
        )

    # -- the one request path ---------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        write: bool = False,
    ) -> JSON:
        params = dict(query or {})
        dry = write and (self.dry_run or _forced_dry_run.get())
        if dry:
            params["dryRun"] = "All"
        if write and method in ("POST", "PATCH", "PUT"):
            params.setdefault("fieldManager", COMPONENT)
        url_path = path + ("?" + urlencode(params) if params else "")
        headers = {"Accept": "application/json", "Content-Type": content_type}
        what = f"{method} {path}"
        attempt = 0
        while True:
            attempt += 1
            started = time.perf_counter()
            status, error = 0, ""
            try:
                status, data = self._send(method, url_path, headers, body)
                if 200 <= status < 300:
                    return json.loads(data) if data else {}
                raise _error_for(status, data, what)
            except KubeError as exc:
                error = type(exc).__name__
                retry = isinstance(exc, Transient) and not isinstance(exc, DisruptionBudgetRefused)
                if not retry or attempt >= self.attempts:
                    raise
                delay = self.backoff * (2 ** (attempt - 1)) * (0.5 + random.random())
                log.warning("transient API error, retrying in %.2fs: %s", delay, exc)
                self._sleep(delay)
            finally:
                calls = _recording.get()
                if calls is not None:
                    calls.append(
                        Call(
                            method,
                            path,
                            status,
                            dry,
                            round((time.perf_counter() - started) * 1000, 2),
                            error,
                        )
                    )

    def _send(
        self, method: str, url_path: str, headers: dict[str, str], body: Any
    ) -> tuple[int, bytes]:
        config = self._api.configuration
        self._api.update_params_for_auth(headers, [], ["BearerToken"], url_path, method, body)
        try:
            response = self._api.call_api(
                method,
                config.host + url_path,
                header_params=headers,
                body=body,
                _request_timeout=self.timeout,
            )
            data = response.read()
        except k8s_client.ApiException as exc:
            # The client raises (status 0) for TLS failures and for some retry-after answers.
            if exc.status:
                return int(exc.status), (exc.body or "").encode()
            raise Transient(f"{method} {url_path}: {exc.reason}") from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise Transient(f"{method} {url_path}: {type(exc).__name__}: {exc}") from exc
        return int(response.status), bytes(data or b"")

    def text(self, path: str, query: Mapping[str, str] | None = None) -> str:
        """A GET the API server answers with text (a container's log), read once."""
        url_path = path + ("?" + urlencode(dict(query)) if query else "")
        status, data = self._send("GET", url_path, {"Accept": "*/*"}, None)
        if 200 <= status < 300:
            return data.decode("utf-8", errors="replace")
        raise _error_for(status, data, f"GET {path}")

    # -- verbs ------------------------------------------------------------------------------

    def get(self, kind: str, namespace: str | None, name: str) -> JSON:
        return self.request("GET", path_for(kind, namespace, name))

    def list_page(
        self,
        kind: str,
        namespace: str | None = None,
        *,
        limit: int = 500,
        continue_token: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> JSON:
        query = {"limit": str(limit)}
        if continue_token:
            query["continue"] = continue_token
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        return self.request("GET", path_for(kind, namespace), query=query)

    def list_all(
        self,
        kind: str,
        namespace: str | None = None,
        *,
        limit: int = 500,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> Iterator[JSON]:
        """Every object, a page at a time (each page is one request; memory stays flat)."""
        token: str | None = None
        while True:
            page = self.list_page(
                kind,
                namespace,
                limit=limit,
                continue_token=token,
                label_selector=label_selector,
                field_selector=field_selector,
            )
            yield from page.get("items") or []
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return

    def list_snapshot(
        self,
        kind: str,
        namespace: str | None = None,
        *,
        limit: int = 500,
        keep: Callable[[JSON], Any] | None = None,
    ) -> tuple[list[Any], str]:
        """Every object (or what ``keep`` makes of each, page by page: the whole list's JSON
        is never held at once) and the list's resourceVersion, where a watch resumes.

        Paged: the continue token keeps every page at the first page's resourceVersion (the
        API server serves the rest of the list from that snapshot), so the pages form one
        consistent list. A token that expired between pages is a 410, Gone: list again.
        """
        items: list[Any] = []
        token: str | None = None
        version = ""
        while True:
            page = self.list_page(kind, namespace, limit=limit, continue_token=token)
            found = page.get("items") or []
            items.extend(found if keep is None else (keep(item) for item in found))
            metadata = page.get("metadata") or {}
            version = version or str(metadata.get("resourceVersion") or "")
            token = metadata.get("continue")
            if not token:
                return items, version

    def watch(
        self,
        kind: str,
        *,
        resource_version: str,
        timeout_seconds: int = 300,
        namespace: str | None = None,
    ) -> Iterator[WatchEvent]:
        """The changes after ``resource_version``, as the API server streams them, until it
        ends the watch (after ``timeout_seconds``) or the connection breaks (Transient).

        Bookmarks are asked for: they move the resourceVersion on while nothing changes, so a
        watch resumed after a quiet hour does not start from a version the API server no
        longer keeps. An ERROR line ends the stream with its Status mapped as for any call:
        410 is Gone (list again). Not retried here and not recorded: the caller owns the loop.
        """
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        path = path_for(kind, namespace)
        what = f"WATCH {path}"
        url_path = path + "?" + urlencode(query)
        headers = {"Accept": "application/json"}
        config = self._api.configuration
        self._api.update_params_for_auth(headers, [], ["BearerToken"], url_path, "GET", None)
        try:
            # The read timeout outlasts the server's own end of the watch; a silent connection
            # longer than that is broken.
            response = self._api.call_api(
                "GET",
                config.host + url_path,
                header_params=headers,
                _request_timeout=(self.timeout, timeout_seconds + 30),
            )
        except k8s_client.ApiException as exc:
            if exc.status:
                raise _error_for(int(exc.status), exc.body, what) from exc
            raise Transient(f"{what}: {exc.reason}") from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise Transient(f"{what}: {type(exc).__name__}: {exc}") from exc
        raw = response.response
        try:
            if not 200 <= int(raw.status) < 300:
                raise _error_for(int(raw.status), raw.read(), what)
            pending = b""
            for chunk in raw.stream(65536):
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    if line.strip():
                        yield _watch_event(line, what)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise Transient(f"{what}: {type(exc).__name__}: {exc}") from exc
        finally:
            raw.release_conn()

    def merge_patch(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        body: JSON,
    ) -> JSON:
        """JSON merge patch. A ``metadata.resourceVersion`` in the body is a precondition:
        the API server answers 409 when the object changed since it was read."""
        return self.request(
            "PATCH",
            path_for(kind, namespace, name),
            body=body,
            content_type="application/merge-patch+json",
            write=True,
        )

    def review_token(self, token: str, audiences: list[str]) -> JSON:
        """A TokenReview's status: who the API server says the bearer of ``token`` is, if it
        was issued for one of ``audiences``. Not a write: never sent as a dry run."""
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": audiences},
        }
        answer = self.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", body=body)
        status: JSON = answer.get("status") or {}
        return status

    def create(self, kind: str, namespace: str | None, body: JSON) -> JSON:
        return self.request("POST", path_for(kind, namespace), body=body, write=True)

    def delete(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        *,
        uid: str | None = None,
        grace_seconds: int | None = None,
    ) -> JSON:
        """Delete; with ``uid`` only that incarnation (a recreated namesake gets 409).

        A DELETE with a body has its options read from the body only: the API server decodes
        the query string only when the body is empty (apiserver's handlers/delete.go), so a
        ``dryRun=All`` query parameter next to DeleteOptions would be ignored and the object
        really deleted. The dry run therefore goes into the body.
        """
        options: JSON = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if uid:
            options["preconditions"] = {"uid": uid}
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        if self.dry_run or _forced_dry_run.get():
            options["dryRun"] = ["All"]
        return self.request("DELETE", path_for(kind, namespace, name), body=options, write=True)

    def evict(self, namespace: str, name: str, *, uid: str | None = None) -> JSON:
        """The Eviction API: honours PodDisruptionBudgets (DisruptionBudgetRefused while a
        budget forbids it). With ``dry_run`` the API server checks the budget (without
        spending it) and RBAC, and deletes nothing."""
        body: JSON = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        if uid:
            body["deleteOptions"] = {"preconditions": {"uid": uid}}
        return self.request(
            "POST", path_for("Pod", namespace, name, "eviction"), body=body, write=True
        )


@contextlib.contextmanager
def _client_errors() -> Iterator[list[str]]:
    """The errors the Kubernetes client's kubeconfig loader logs (it logs a failing exec
    credential plugin with logging.error, on the root logger, and carries on)."""
    said: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.ERROR and record.pathname.endswith("kube_config.py"):
                said.append(record.getMessage().strip())

    keep = _Keep()
    root = logging.getLogger()
    root.addHandler(keep)
    try:
        yield said
    finally:
        root.removeHandler(keep)


def _has_credentials(configuration: Any) -> bool:
    """Whether a loaded client configuration authenticates at all (a token, a client
    certificate, or a user and password)."""
    return bool(
        configuration.api_key
        or configuration.cert_file
        or configuration.username
        or configuration.refresh_api_key_hook
    )
