"""CloudEvents over HTTP for the local receivers (archive, dead letters): parse, validate, record.

The archive is what replay sends again; it must not reinterpret events. So an event here is its
attributes (core and extensions, as strings, the way they travel in binary mode) plus its data
as raw bytes: what came in as the body of a binary-mode request is recorded unchanged.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubectl_kn_rescheduler.routing.filters import parse_time

STRUCTURED = "application/cloudevents+json"
BATCH = "application/cloudevents-batch+json"
SPEC_VERSIONS = ("1.0", "0.3")
_EXTENSION_NAME = re.compile(r"^[a-z0-9]+$")


class NotAnEvent(ValueError):
    """The HTTP message carries no CloudEvent at all (no ce- headers, no structured body)."""


class InvalidEvent(ValueError):
    """The HTTP message claims to be a CloudEvent but is not a valid one."""


@dataclass
class Event:
    attributes: dict[str, str]
    data: bytes | None = None

    @property
    def id(self) -> str:
        return self.attributes.get("id", "")

    @property
    def type(self) -> str:
        return self.attributes.get("type", "")

    def copy(self) -> Event:
        return Event(dict(self.attributes), self.data)


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", maxsplit=1)[0].strip().lower()
    return media in ("", "application/json", "text/json") or media.endswith("+json")


def _media(content_type: str) -> str:
    return content_type.split(";", maxsplit=1)[0].strip().lower()


def encoding(headers: Mapping[str, str]) -> str | None:
    """``binary``, ``structured``, ``batch`` or None, as the CloudEvents SDK reads a message."""
    lower = {k.lower(): v for k, v in headers.items()}
    media = _media(lower.get("content-type", ""))
    if media == STRUCTURED:
        return "structured"
    if media == BATCH:
        return "batch"
    if "ce-specversion" in lower:
        return "binary"
    return None


def from_http(headers: Mapping[str, str], body: bytes) -> Event:
    """The CloudEvent in an HTTP message (binary or structured mode), validated."""
    mode = encoding(headers)
    if mode is None:
        raise NotAnEvent("neither ce-specversion header nor a CloudEvents content type")
    if mode == "batch":
        raise InvalidEvent("batched CloudEvents are not accepted")
    if mode == "binary":
        attributes: dict[str, str] = {}
        for name, value in headers.items():
            lower = name.lower()
            if lower.startswith("ce-") and len(lower) > 3:
                attributes[lower[3:]] = value
            elif lower == "content-type":
                attributes["datacontenttype"] = value
        event = Event(attributes, body if body else None)
    else:
        event = _from_structured(body)
    validate(event)
    return event


def _from_structured(body: bytes) -> Event:
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise InvalidEvent(f"structured CloudEvent is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise InvalidEvent("structured CloudEvent is not a JSON object")
    attributes: dict[str, str] = {}
    for name, value in doc.items():
        if name in ("data", "data_base64"):
            continue
        if value is None:
            continue
        if isinstance(value, bool):
            attributes[name] = "true" if value else "false"
        elif isinstance(value, (str, int)):
            attributes[name] = str(value)
        else:
            raise InvalidEvent(f"attribute {name!r} has a non-scalar value")
    data: bytes | None = None
    if "data_base64" in doc and doc["data_base64"] is not None:
        try:
            data = base64.b64decode(doc["data_base64"], validate=True)
        except (ValueError, TypeError) as exc:
            raise InvalidEvent(f"data_base64 is not base64: {exc}") from exc
    elif "data" in doc:
        value = doc["data"]
        content_type = attributes.get("datacontenttype", "")
        if isinstance(value, str) and not _is_json(content_type):
            data = value.encode()
        else:
            data = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    return Event(attributes, data)


def validate(event: Event) -> None:
    """What the CloudEvents SDK's Validate checks before a Broker accepts an event."""
    attrs = event.attributes
    if attrs.get("specversion") not in SPEC_VERSIONS:
        raise InvalidEvent(f"unsupported specversion {attrs.get('specversion')!r}")
    for required in ("id", "source", "type"):
        if not attrs.get(required):
            raise InvalidEvent(f"required attribute {required!r} is missing or empty")
    if "time" in attrs:
        try:
            parse_time(attrs["time"])
        except ValueError as exc:
            raise InvalidEvent(f"time: {exc}") from exc
    for name in attrs:
        if not _EXTENSION_NAME.match(name):
            raise InvalidEvent(f"invalid attribute name {name!r}")


def to_binary(event: Event) -> tuple[dict[str, str], bytes]:
    headers = {}
    for name, value in event.attributes.items():
        if name == "datacontenttype":
            headers["Content-Type"] = value
        else:
            headers["ce-" + name] = value
    return headers, event.data or b""


def to_structured_dict(event: Event) -> dict[str, Any]:
    """The event in the JSON event format (what the archive and dead-letter files hold)."""
    out: dict[str, Any] = dict(event.attributes)
    if event.data is None:
        return out
    content_type = event.attributes.get("datacontenttype", "")
    if _is_json(content_type):
        try:
            out["data"] = json.loads(event.data)
            return out
        except ValueError:
            pass
    elif _media(content_type).startswith("text/"):
        try:
            out["data"] = event.data.decode()
            return out
        except UnicodeDecodeError:
            pass
    out["data_base64"] = base64.b64encode(event.data).decode()
    return out


def to_structured(event: Event) -> tuple[dict[str, str], bytes]:
    body = json.dumps(to_structured_dict(event), separators=(",", ":")).encode()
    return {"Content-Type": STRUCTURED + "; charset=utf-8"}, body
