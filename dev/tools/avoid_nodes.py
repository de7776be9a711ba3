"""Ready every workload for the admission policies: ``python -m dev.tools.avoid_nodes [--dry-run]``.

The admission policies (knative/components/admission-policies) read a workload's exclusions
from ``kn-rescheduler.io/avoid-nodes``, which update-annotations writes with the state since the
policies exist. A state written earlier has none, and its exclusions would reach new pods only
at the workload's next move. This writes it now, from the state itself, on every ReplicaSet,
StatefulSet and Job that carries a state of its own (a copy of another object's state, which the
webhook ignores too, gets none), and removes one whose state is gone. A state it cannot read is
left alone and reported. It also puts on the param label (``kn-rescheduler.io/admission-param``)
that the policies put on a workload with one of our annotations at its next create or update:
without it, a workload that is not updated is not a param, and its pods get nothing. Each write
is a JSON merge patch of those two keys with the resourceVersion it was read at; ``--dry-run``
sends them with ``dryRun=All``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from shared.api import avoidnodes
from shared.api.keys import (
    ADMISSION_PARAM_LABEL,
    ADMISSION_PARAM_VALUE,
    AVOID_PRESSURE_KEY,
    LOAD_AWARE_KEY,
    POLICY_ANNOTATION,
    STATE_ANNOTATION,
)
from shared.api.state import StateError, load_state_lenient
from shared.platform import kube
from shared.platform.kube import Kube
from shared.workloads.state import foreign_copy

HOLDER_KINDS: Final = ("ReplicaSet", "StatefulSet", "Job")

ATTEMPTS: Final = 5


@dataclass(frozen=True)
class Backfill:
    """The patch one holder needs, and why (pure)."""

    patch: dict[str, Any]
    says: str


def backfill(kind: str, obj: Mapping[str, Any]) -> Backfill | str | None:
    """What ``obj`` needs: a patch, a reason it is left alone (a str), or None (nothing)."""
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    raw, have = annotations.get(STATE_ANNOTATION), annotations.get(avoidnodes.ANNOTATION)
    want: str | None = None
    if raw is not None:
        try:
            state = load_state_lenient(raw).state
        except StateError as exc:
            return f"unreadable state, left alone: {exc}"
        uid = str(meta.get("uid", ""))
        if foreign_copy(state, kind, uid) is None:
            want = avoidnodes.render(state, per_pod=kind == "StatefulSet", holder_uid=uid)
    asks = POLICY_ANNOTATION in annotations or any(
        annotations.get(key) == "true" for key in (AVOID_PRESSURE_KEY, LOAD_AWARE_KEY)
    )
    if kind == "ReplicaSet" and (obj.get("spec") or {}).get("replicas", 1) == 0:
        asks = False  # it makes no pods: no param (shared.admission.policies.holder_policy)
    labelled = (meta.get("labels") or {}).get(ADMISSION_PARAM_LABEL) == ADMISSION_PARAM_VALUE
    metadata: dict[str, Any] = {"resourceVersion": meta.get("resourceVersion", "")}
    says = []
    if want != have:
        metadata["annotations"] = {avoidnodes.ANNOTATION: want}
        says.append(f"wrote {want}" if want else "removed a list without a state of its own")
    if asks and not labelled:
        metadata["labels"] = {ADMISSION_PARAM_LABEL: ADMISSION_PARAM_VALUE}
        says.append(f"labelled {ADMISSION_PARAM_LABEL}")
    if not says:
        return None
    return Backfill({"metadata": metadata}, "; ".join(says))


def _apply(api: Kube, kind: str, namespace: str, name: str) -> str:
    for _ in range(ATTEMPTS):
        try:
            obj = api.get(kind, namespace, name)
        except kube.NotFound:
            return "gone"
        plan = backfill(kind, obj)
        if plan is None:
            return "already current"
        if isinstance(plan, str):
            return plan
        try:
            api.merge_patch(kind, namespace, name, plan.patch)
        except kube.NotFound:
            return "gone"
        except kube.Conflict:
            continue
        return plan.says
    return f"still changing after {ATTEMPTS} attempts: run again"


def run(api: Kube) -> list[str]:
    report = []
    for kind in HOLDER_KINDS:
        for obj in api.list_all(kind):
            if backfill(kind, obj) is not None:
                meta = obj["metadata"]
                outcome = _apply(api, kind, meta["namespace"], meta["name"])
                report.append(f"{kind} {meta['namespace']}/{meta['name']}: {outcome}")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="send every write with dryRun=All")
    args = parser.parse_args(argv)
    try:
        report = run(Kube.from_environment(dry_run=args.dry_run))
    except kube.KubeError as exc:
        print(f"avoid-nodes backfill failed: {exc}", file=sys.stderr)
        return 1
    for line in report:
        print(("(dry run) " if args.dry_run else "") + line)
    print(f"{len(report)} objects needed their list")
    return 0


if __name__ == "__main__":
    sys.exit(main())
