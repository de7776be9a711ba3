"""A small JSON-over-HTTPS client for the harness's own API calls.

The harness (start-up checks, node registration, the fake kubelet) needs a handful of verbs on
plain JSON dicts, a streaming watch, and one connection pool shared by its threads. It does not
depend on the project's ``shared`` code, which is developed beside it, nor on the generated
client's models.

It sits on urllib3 and orjson, not on requests and json: at scale the fake kubelet writes every
pod's status several times, and those writes through requests were 27 % of the harness
process's own time in a sampling profile. Side by side, this client takes 0.35 ms of CPU a
request where requests took 0.59 (dev/bench/RESULTS.md, "Where the harness's time goes").
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode

import orjson
import urllib3
from urllib3.exceptions import HTTPError

JSON = dict[str, Any]

MERGE_PATCH: Final = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"

# Connections kept per host: the fake kubelet's shards, its watches and the tracker share one
# pool; more threads than this at once open extra connections and close them after use.
POOL_SIZE: Final = 32


class ApiError(Exception):
    """The API server answered with an error status (0: no answer at all)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


def _message(status: int, data: bytes) -> ApiError:
    try:
        body = orjson.loads(data)
        message = str(body.get("message", data.decode(errors="replace")))
    except (orjson.JSONDecodeError, AttributeError):
        message = data.decode(errors="replace")
    return ApiError(status, message)


def lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The non-blank lines of a stream that arrives in chunks of any size: a watch writes one
    JSON object per line, and a chunk may end in the middle of one or hold several."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *complete, pending = pending.split(b"\n")
        yield from (line for line in complete if line.strip())
    if pending.strip():
        yield pending


class Rest:
    """Verbs against one API server, authenticated with a client certificate."""

    def __init__(
        self,
        server: str,
        *,
        ca_file: Path,
        cert_file: Path,
        key_file: Path,
        user_agent: str = "kn-rescheduler-localcluster",
        timeout: float = 15.0,
    ) -> None:
        self.server = server.rstrip("/")
        self._ca_file = ca_file
        self._cert = (cert_file, key_file)
        self._timeout = timeout
        self._headers = {"User-Agent": user_agent, "Accept": "application/json"}
        self._lock = threading.Lock()
        self._pool: urllib3.PoolManager | None = None

    def _manager(self) -> urllib3.PoolManager:
        # Built on first use: the certificates may be written after the client is made.
        pool = self._pool
        if pool is not None:
            return pool
        with self._lock:
            if self._pool is None:
                context = ssl.create_default_context(cafile=str(self._ca_file))
                context.load_cert_chain(str(self._cert[0]), str(self._cert[1]))
                self._pool = urllib3.PoolManager(
                    maxsize=POOL_SIZE,
                    ssl_context=context,
                    retries=False,
                )
            return self._pool

    def _url(self, path: str, params: Mapping[str, str] | None) -> str:
        url = self.server + path
        return f"{url}?{urlencode(params)}" if params else url

    def _send(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: urllib3.Timeout | float,
        stream: bool = False,
    ) -> urllib3.BaseHTTPResponse:
        try:
            return self._manager().request(
                method,
                url,
                body=body,
                headers={**self._headers, **(headers or {})},
                timeout=timeout,
                preload_content=not stream,
                redirect=False,
            )
        except (HTTPError, OSError) as e:
            raise ApiError(0, str(e)) from e

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> JSON:
        headers = {}
        data = None
        if body is not None:
            data = orjson.dumps(body)
            headers["Content-Type"] = content_type
        resp = self._send(
            method,
            self._url(path, params),
            body=data,
            headers=headers,
            timeout=timeout or self._timeout,
        )
        if resp.status >= 400:
            raise _message(resp.status, resp.data)
        if not resp.data:
            return {}
        try:
            result: JSON = orjson.loads(resp.data)
        except orjson.JSONDecodeError as e:
            raise ApiError(0, f"{method} {path}: not JSON: {e}") from e
        return result

    def get(self, path: str, params: Mapping[str, str] | None = None) -> JSON:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: JSON) -> JSON:
        return self.request("POST", path, body=body)

    def patch(self, path: str, body: JSON, content_type: str = MERGE_PATCH) -> JSON:
        return self.request("PATCH", path, body=body, content_type=content_type)

    def delete(self, path: str) -> JSON:
        return self.request("DELETE", path)

    def text(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        """GET returning (status, body text), for health endpoints; (0, error) on no answer."""
        try:
            resp = self._send("GET", self.server + path, timeout=timeout)
        except ApiError as e:
            return 0, str(e)
        return resp.status, resp.data.decode(errors="replace")

    def watch(
        self, path: str, params: Mapping[str, str], timeout_seconds: int = 5
    ) -> Iterator[JSON]:
        """Watch events (``{"type": ..., "object": ...}``) until the server ends the watch."""
        query = dict(params)
        query["watch"] = "true"
        query["timeoutSeconds"] = str(timeout_seconds)
        query.setdefault("allowWatchBookmarks", "true")
        resp = self._send(
            "GET",
            self._url(path, query),
            timeout=urllib3.Timeout(connect=5.0, read=timeout_seconds + 10.0),
            stream=True,
        )
        ended = False
        try:
            if resp.status >= 400:
                raise _message(resp.status, resp.read())
            try:
                for line in lines(resp.stream(64 * 1024)):
                    event: JSON = orjson.loads(line)
                    yield event
            except (HTTPError, OSError) as e:
                raise ApiError(0, str(e)) from e
            ended = True
        finally:
            if not ended:
                # Left mid-stream (an error, or the caller stopped reading): the connection still
                # carries the rest of the watch, so it is closed rather than reused.
                resp.close()
            resp.release_conn()
