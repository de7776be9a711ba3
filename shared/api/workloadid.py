"""Which failures are one workload's, when the controllers under a workload come and go.

A node turns suspect when several *distinct* workloads fail there, because one workload broken
everywhere says nothing about the node. Counted by the pod's controller, that rule breaks on
the two most common workloads: a Deployment makes a new ReplicaSet at every rollout (``kubectl
rollout restart`` included), and a CronJob a new Job at every run. One Deployment crash-looping
on every node, across one rollout, would then be two "workloads" on each node and mark healthy
nodes suspect, up to the cap. So failures are counted by their **top-level workload**.

Where it comes from:

- update-annotations' replies (``pod.rescheduled``, ``.exhausted``) carry it as ``topWorkload``:
  the holder's controller as the holder's own ownerReference names it (the ReplicaSet's
  Deployment, the Job's CronJob), read from the API server on the way to the move;
- detect-failures' ``pod.failing`` knows the pod's ownerReferences only (it has no API access),
  and neither do the replies of an older update-annotations, nor the records already on Nodes.
  For those, the names the controllers give tell it, and ``family`` reads them:

  - a ReplicaSet made by the Deployment controller is named ``<deployment>-<pod-template-hash>``
    (pkg/controller/deployment/sync.go), the hash ``rand.SafeEncodeString`` of a 32-bit FNV
    hash in decimal: 1 to 10 characters of ``bcdfghjklmnpqrstvwxz2456789`` (no vowels, no 0, 1
    or 3; k8s.io/apimachinery/pkg/util/rand);
  - a Job made by the CronJob controller is named ``<cronjob>-<scheduled time in minutes since
    the epoch>`` (pkg/controller/cronjob, getJobName);
  - a bare pod update-annotations replaced is named ``<original>-<5 hex digits>``
    (``shared.api.barepods.replacement_name``).

Failures are counted by ``family``: namespace and name with that one suffix taken off, without
the kind, so ``Deployment shop/web`` (a reply's ``topWorkload``), ``ReplicaSet
shop/web-7d9c8b6f4`` (a ``pod.failing`` report) and an old record's ``ReplicaSet
shop/web-5c8f9d7b6`` are the same workload. A name that only looks like a controller's (a
ReplicaSet of its own called ``web-v2``, a Job ``migrate-2024``) joins the family of its
prefix, and two workloads of the same name and different kinds join too: either error counts
fewer distinct workloads, never more, so it can only keep a node from turning suspect.
"""

from __future__ import annotations

import re
from typing import Final

# The Deployment controller's ReplicaSet suffix: rand.SafeEncodeString of a uint32 in decimal.
_POD_TEMPLATE_HASH: Final = re.compile(r"^(?P<base>.+)-[bcdfghjklmnpqrstvwxz2456789]{1,10}$")
# The CronJob controller's Job suffix: the scheduled time in minutes since the epoch.
_SCHEDULED_MINUTES: Final = re.compile(r"^(?P<base>.+)-[0-9]+$")
# update-annotations' replacement of a bare pod: the first pod's name and 5 hex digits.
_REPLACEMENT: Final = re.compile(r"^(?P<base>.+)-[0-9a-f]{5}$")

_SUFFIXES: Final = {
    "ReplicaSet": _POD_TEMPLATE_HASH,
    "Job": _SCHEDULED_MINUTES,
    "Pod": _REPLACEMENT,
}


def workload_id(kind: str, namespace: str, name: str) -> str:
    """How a workload is named in the record and in messages: ``Deployment shop/web``."""
    return f"{kind} {namespace}/{name}"


def family(workload: str) -> str:
    """The top-level workload a ``workload_id`` belongs to, as ``namespace/name`` (the module
    docstring says how and why); a string that is no ``workload_id`` is its own family."""
    kind, _, path = workload.partition(" ")
    namespace, slash, name = path.partition("/")
    if not slash or not name:
        return workload
    suffix = _SUFFIXES.get(kind)
    found = suffix.match(name) if suffix is not None else None
    return f"{namespace}/{found.group('base') if found else name}"
