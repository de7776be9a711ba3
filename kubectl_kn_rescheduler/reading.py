"""What the plugin reads from the cluster, shared by its commands: the installed settings, our
Events, and a kind's name as people type it.

Reads only. Every write the plugin can make is in ``cleanup`` (with ``--yes``) and in
``explain``'s server-side dry runs (``dryRun=All``: validated, never stored).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from shared.api.keys import COMPONENT, DEFAULT_NAMESPACE
from shared.api.times import parse_kube_time
from shared.platform import kube
from shared.platform.config import CONFIG_FILE_ENV, ENV_PREFIX, Config, ConfigError

# The label kustomize's configMapGenerator puts on the settings (knative/kustomization.yaml).
CONFIG_SELECTOR: Final = (
    "app.kubernetes.io/component=config,app.kubernetes.io/part-of=kn-rescheduler"
)

# kubectl's names for the kinds the plugin takes (``kubectl api-resources``), lower case.
KINDS: Final[Mapping[str, str]] = {
    "deployment": "Deployment",
    "deployments": "Deployment",
    "deploy": "Deployment",
    "replicaset": "ReplicaSet",
    "replicasets": "ReplicaSet",
    "rs": "ReplicaSet",
    "statefulset": "StatefulSet",
    "statefulsets": "StatefulSet",
    "sts": "StatefulSet",
    "job": "Job",
    "jobs": "Job",
    "pod": "Pod",
    "pods": "Pod",
    "po": "Pod",
}


# Where the rules are explained; the plugin names the section of each rule it reports.
RULES: Final = "docs/failure-rules.md"


def section(doc: str, heading: str) -> str:
    """A link to ``heading`` in ``doc``, with the anchor GitHub makes of it: lower case, spaces
    to dashes, every other character but letters, digits, ``-`` and ``_`` dropped."""
    anchor = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
    return f"{doc}#{anchor}"


class UsageError(ValueError):
    """A command line the plugin cannot act on; said with exit status 2."""


def parse_target(text: str, default_kind: str | None = None) -> tuple[str, str]:
    """``deployment/web`` (kubectl's TYPE/NAME, its short names too) as (kind, name)."""
    kind_text, sep, name = text.partition("/")
    if not sep:
        if default_kind is None:
            raise UsageError(
                f"{text!r}: name the kind as kubectl does, TYPE/NAME (deployment/web, "
                "statefulset/db, job/backup, rs/web-5d8c, pod/web-0)"
            )
        kind_text, name = default_kind, text
    kind = KINDS.get(kind_text.lower())
    if kind is None:
        raise UsageError(
            f"{kind_text!r} is not a kind kn-rescheduler moves pods of: "
            + ", ".join(sorted({v for v in KINDS.values()}))
        )
    if not name:
        raise UsageError(f"{text!r} names no object")
    return kind, name


@dataclass(frozen=True)
class Settings:
    """The settings the plugin judges with, and where they came from (said in its output)."""

    cfg: Config
    source: str
    # Read from an installed settings ConfigMap (else the defaults of this release).
    installed: bool = False


def installed_settings(api: kube.Kube, namespace: str = DEFAULT_NAMESPACE) -> Settings:
    """The functions' settings as installed: the newest ConfigMap made from knative/config.env.

    Not found or not readable (no RBAC to read ConfigMaps there, another install): the defaults
    of this release, and the output says so. A Service's own env, which wins over the ConfigMap
    in the functions, is not read.
    """
    try:
        found = list(api.list_all("ConfigMap", namespace, label_selector=CONFIG_SELECTOR))
    except kube.KubeError as exc:
        return Settings(Config(), f"the defaults: the installed settings cannot be read ({exc})")
    if not found:
        return Settings(Config(), f"the defaults: no settings ConfigMap in namespace {namespace}")
    newest = max(found, key=lambda c: str((c.get("metadata") or {}).get("creationTimestamp", "")))
    name = f"{namespace}/{newest['metadata']['name']}"
    # Everything but the path of a settings file: that would be read from this machine.
    data = {
        k: str(v)
        for k, v in (newest.get("data") or {}).items()
        if k.startswith(ENV_PREFIX) and k != CONFIG_FILE_ENV
    }
    try:
        return Settings(Config.from_env(data), f"ConfigMap {name}", installed=True)
    except ConfigError as exc:
        return Settings(Config(), f"the defaults: ConfigMap {name} does not parse ({exc})")


@dataclass(frozen=True)
class OurEvent:
    """A Kubernetes Event kn-rescheduler recorded, as the plugin shows it."""

    at: datetime | None
    type: str
    reason: str
    kind: str
    name: str
    count: int
    message: str
    uid: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat() if self.at else None,
            "type": self.type,
            "reason": self.reason,
            "object": f"{self.kind}/{self.name}",
            "count": self.count,
            "message": self.message,
        }


def _is_ours(event: Mapping[str, Any]) -> bool:
    source = (event.get("source") or {}).get("component")
    return COMPONENT in (event.get("reportingComponent"), source)


def our_events(items: Iterable[Mapping[str, Any]]) -> list[OurEvent]:
    """Our Events among ``items``, oldest first (by their last time)."""
    found = []
    for event in items:
        if not _is_ours(event):
            continue
        involved = event.get("involvedObject") or {}
        raw_time = (
            event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp")
        )
        count = event.get("count")
        found.append(
            OurEvent(
                at=parse_kube_time(raw_time) if isinstance(raw_time, str) else None,
                type=str(event.get("type", "")),
                reason=str(event.get("reason", "")),
                kind=str(involved.get("kind", "")),
                name=str(involved.get("name", "")),
                count=count if isinstance(count, int) and count > 0 else 1,
                message=str(event.get("message", "")),
                uid=str(involved.get("uid") or ""),
            )
        )
    return sorted(found, key=lambda e: (e.at is None, e.at or datetime.min))


def ago(at: datetime | None, now: datetime) -> str:
    """``3m ago``, ``2h ago``, ``in 5m``: kubectl's way of saying an age."""
    if at is None:
        return "at an unknown time"
    seconds = int((now - at).total_seconds())
    later = seconds < 0
    seconds = abs(seconds)
    if seconds < 120:
        text = f"{seconds}s"
    elif seconds < 2 * 3600:
        text = f"{seconds // 60}m"
    elif seconds < 2 * 86400:
        text = f"{seconds // 3600}h"
    else:
        text = f"{seconds // 86400}d"
    return f"in {text}" if later else f"{text} ago"
