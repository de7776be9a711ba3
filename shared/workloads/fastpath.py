"""The fast path: a pod failing on a node already suspect moves at its first failure.

The crash-loop threshold (3 restarts in a row) and the 30 s a failed pull or start must last
protect a workload from being moved for one bad run. On a node that several workloads already
failed on, that wait buys nothing: with a real kubelet's back-off (10 s, 20 s, 40 s ...) three
restarts cost over a minute on a node known to be broken.

So detect-failures, which has no API access, reports a pod's *first* node-fixable failure as
an early report (``kind: early``) when the full rules do not call it failing yet, and
update-annotations acts on an early report only when the pod's node carries the suspect label
(one Node GET): anywhere else it waits for the full rules, as before. assess-nodes never counts
an early report as evidence against a node, nor the move that follows it (the reply after the
move says ``kind: early``): otherwise a one-off crash on a suspect node would keep it suspect.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta
from typing import Any

from shared.api.keys import SUSPECT_LABEL, SUSPECT_VALUE
from shared.platform.config import Config


def early_config(cfg: Config) -> Config:
    """The rules at first sight: one crash in a row, a failed pull or start at once."""
    return replace(cfg, crashloop_restart_threshold=1, waiting_failure_after=timedelta(0))


def is_suspect(node: Mapping[str, Any]) -> bool:
    """Does the Node carry the suspect label assess-nodes sets?"""
    labels = (node.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(SUSPECT_LABEL) == SUSPECT_VALUE)
