"""The moved-off mark: a label on a Node saying when a pod was last moved off it.

In a burst (a failure spreading over several nodes at once) replacements are placed within a
second of their moves, while assess-nodes hears each failure through the Broker and writes
each Node with a read and a compare-and-swap: its failing-workloads label came 7 to 12 s after
the first move off a broken node (dev/bench/RESULTS.md), and replacements placed meanwhile
landed on the other broken nodes. update-annotations knows the node at the moment it moves a
pod off it, so it writes this mark then, before the pod is removed; the webhook keeps other
workloads' replacements softly off marked nodes exactly as off labelled ones.

The value is the move's time in whole Unix seconds, not a count: node affinity compares
integer label values (the ``Lt`` operator), so the webhook's preference says "not marked
within the window" with no clock of its own, and a mark nobody removes (assess-nodes not
deployed) stops steering once its window passes. assess-nodes' review removes expired marks.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.api.keys import MOVED_OFF_LABEL, opted_out


def mark_value(now: datetime) -> str:
    """The label's value for a move at ``now``: whole Unix seconds."""
    return str(int(now.timestamp()))


def marked_at(labels: Mapping[str, str] | None) -> datetime | None:
    """When the node was last marked; None when it is not, or the value is not ours (not a
    non-negative integer: node affinity would not compare it either)."""
    raw = (labels or {}).get(MOVED_OFF_LABEL)
    if raw is None or not raw.isascii() or not raw.isdigit():
        return None
    try:
        return datetime.fromtimestamp(int(raw), UTC)
    except (OverflowError, OSError, ValueError):
        return None


def fresh(labels: Mapping[str, str] | None, now: datetime, window: timedelta) -> bool:
    """Whether a mark newer than ``window`` is on the node: it steers replacements now."""
    at = marked_at(labels)
    return at is not None and at > now - window


def expired(labels: Mapping[str, str] | None, now: datetime, window: timedelta) -> bool:
    """Whether the node carries the label and it steers nothing any more: older than the
    window, or a value that is not a time. Ours to remove."""
    return MOVED_OFF_LABEL in (labels or {}) and not fresh(labels, now, window)


def steers_before(now: datetime, window: timedelta) -> str:
    """The ``Lt`` operand of the webhook's preference: a node whose mark is below it (or that
    has none) scores; a node marked at or after it does not. It agrees with ``fresh`` to the
    second: a mark is fresh when it is newer than ``now - window``, and marks are whole
    seconds, so the first fresh one is the whole second after it."""
    return str(int((now - window).timestamp()) + 1)


def mark_patch(node: Mapping[str, Any], now: datetime, window: timedelta) -> dict[str, Any] | None:
    """The merge patch marking ``node`` as moved off at ``now``; None when there is nothing to
    write: the node opted out (never ours to mark), or it carries a mark young enough (half the
    window) that a burst of moves off one node writes it once.

    The resourceVersion makes it a compare-and-swap: assess-nodes writes the Node's labels
    too, and a conflict is read again rather than written over.
    """
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    if opted_out(labels):
        return None
    at = marked_at(labels)
    if at is not None and at > now - window / 2:
        return None
    return {
        "metadata": {
            "resourceVersion": str(meta.get("resourceVersion", "")),
            "labels": {MOVED_OFF_LABEL: mark_value(now)},
        }
    }
