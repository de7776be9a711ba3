"""A small JSON-over-HTTPS client for the harness's own API calls.

The harness (start-up checks, node registration, the fake kubelet) needs a handful of verbs on
plain JSON dicts, a streaming watch, and one session per thread. It does not depend on the
project's ``shared`` code, which is developed beside it, nor on the generated client's models.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import requests

JSON = dict[str, Any]

MERGE_PATCH: Final = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"


class ApiError(Exception):
    """The API server answered with an error status (0: no answer at all)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


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
        self._verify = str(ca_file)
        self._cert = (str(cert_file), str(key_file))
        self._timeout = timeout
        self._user_agent = user_agent
        self._local = threading.local()

    def _session(self) -> requests.Session:
        s: requests.Session | None = getattr(self._local, "session", None)
        if s is None:
            s = requests.Session()
            # No proxies, and no REQUESTS_CA_BUNDLE overriding our CA: the cluster is local.
            s.trust_env = False
            s.verify = self._verify
            s.cert = self._cert
            s.headers["User-Agent"] = self._user_agent
            s.headers["Accept"] = "application/json"
            self._local.session = s
        return s

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
            data = json.dumps(body)
            headers["Content-Type"] = content_type
        try:
            resp = self._session().request(
                method,
                self.server + path,
                data=data,
                headers=headers,
                params=params,
                timeout=timeout or self._timeout,
            )
        except requests.RequestException as e:
            raise ApiError(0, str(e)) from e
        if resp.status_code >= 400:
            try:
                message = str(resp.json().get("message", resp.text))
            except ValueError:
                message = resp.text
            raise ApiError(resp.status_code, message)
        if not resp.content:
            return {}
        result: JSON = resp.json()
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
            resp = self._session().get(self.server + path, timeout=timeout)
        except requests.RequestException as e:
            return 0, str(e)
        return resp.status_code, resp.text

    def watch(
        self, path: str, params: Mapping[str, str], timeout_seconds: int = 5
    ) -> Iterator[JSON]:
        """Watch events (``{"type": ..., "object": ...}``) until the server ends the watch."""
        query = dict(params)
        query["watch"] = "true"
        query["timeoutSeconds"] = str(timeout_seconds)
        query.setdefault("allowWatchBookmarks", "true")
        try:
            resp = self._session().get(
                self.server + path,
                params=query,
                stream=True,
                timeout=(5.0, timeout_seconds + 10.0),
            )
        except requests.RequestException as e:
            raise ApiError(0, str(e)) from e
        with resp:
            if resp.status_code >= 400:
                raise ApiError(resp.status_code, resp.text)
            try:
                for line in resp.iter_lines():
                    if line:
                        event: JSON = json.loads(line)
                        yield event
            except requests.RequestException as e:
                raise ApiError(0, str(e)) from e
