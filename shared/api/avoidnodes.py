"""The exclusions again, flat, for the admission policies: `kn-rescheduler.io/avoid-nodes`.

The state (`kn-rescheduler.io/state`) is versioned JSON, and the API server's CEL has no JSON
decoder, so a MutatingAdmissionPolicy cannot read the nodes a new pod must avoid from it.
update-annotations writes them a second time in the same patch, in a form CEL splits:

    <holder uid>;<scope>=<node>,<node>;<scope>=<node>

- The first field is the uid of the object the list was written for. The Deployment controller
  copies a Deployment's annotations onto its newest ReplicaSet, and `kubectl rollout undo` copies
  a ReplicaSet's onto the Deployment: a copy carries another object's uid, and the policy
  ignores it (the webhook does the same with the state's `holderUid`).
- ``*`` is the scope of a ReplicaSet, a Job or a bare pod (one list for all its pods); a
  StatefulSet's scopes are its pod names (each pod has its own exclusions).
- Node names and pod names are DNS-1123 names: none holds ``;``, ``=`` or ``,``.

Derived from the state, never read back by the functions: the state stays the one record. The
annotation is absent when no scope has an exclusion.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from shared.api.keys import PREFIX
from shared.api.state import WorkloadState, is_valid_node_name

ANNOTATION: Final = PREFIX + "avoid-nodes"
SEPARATOR: Final = ";"
# The scope of every pod of a workload whose pods share one list.
ANY_POD: Final = "*"


def render(state: WorkloadState, *, per_pod: bool, holder_uid: str) -> str | None:
    """The annotation's value for ``state``; None when there is nothing to avoid (the
    annotation is then removed). ``per_pod``: a StatefulSet's state (by pod name)."""
    scopes: list[tuple[str, tuple[str, ...]]]
    if per_pod:
        scopes = [(name, entry.excluded_nodes) for name, entry in sorted(state.per_pod.items())]
    else:
        scopes = [(ANY_POD, state.excluded_nodes)]
    # A name the API server would refuse never reaches a pod (the policy drops the whole list
    # when one is invalid): left out here too.
    fields = [
        f"{scope}={','.join(valid)}"
        for scope, nodes in scopes
        if (valid := [n for n in nodes if is_valid_node_name(n)])
    ]
    if not fields:
        return None
    return SEPARATOR.join([holder_uid or "-", *fields])


@dataclass(frozen=True)
class AvoidNodes:
    """The annotation read back (tools and tests): whose list, and the nodes per scope."""

    holder_uid: str
    scopes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def for_pod(self, pod_name: str | None, *, per_pod: bool) -> tuple[str, ...]:
        if per_pod:
            return self.scopes.get(pod_name or "", ()) if pod_name else ()
        return self.scopes.get(ANY_POD, ())


def parse(raw: str | None) -> AvoidNodes | None:
    """The annotation's parts; None when absent or not in the form `render` writes."""
    if not raw:
        return None
    uid, *fields = raw.split(SEPARATOR)
    scopes: dict[str, tuple[str, ...]] = {}
    for item in fields:
        scope, sep, nodes = item.partition("=")
        if not sep or not scope or scope in scopes:
            return None
        names = tuple(nodes.split(","))
        if not all(is_valid_node_name(n) for n in names):
            return None
        scopes[scope] = names
    if not scopes:
        return None
    return AvoidNodes(uid, scopes)
