"""What the chaos suite (dev/bench/chaos) found, each as a focused reproduction on the real control
plane: update-annotations dies at one exact moment, then the event is delivered again, as the
Broker does after a delivery that got no answer.

A process dies at an exact point only on demand, which no real server can arrange: the API
client here is the real one, raising a ``BaseException`` (nothing in the handler catches it,
as nothing runs after a SIGKILL) at the moment the process would die. Everything before that
moment really happened on the API server.

Found by ``python -m dev.bench.chaos`` (seed 11):

- a SIGKILL after the pod's removal and before its ``Rescheduled`` Event: the redelivery finds
  the pod gone (or being deleted), says "nothing to do", and the move, counted in the
  workload's state, never gets its Event (invariant ``removed-pods-recorded``);
- a SIGKILL after a bare pod's replacement was created and before the bare pod was deleted,
  when the replacement is moved in turn before the bare pod's event comes back: the redelivery
  finds the replacement gone and creates it again, so one bare pod becomes two (and every
  further crash of that kind one more; invariant ``replicas-healthy``: four live pods in one
  lineage in the full run).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shared.api.keys import REASON_RESCHEDULED
from shared.platform.kube import Kube
from shared.pods.update_annotations.bodies import ORIGIN_ANNOTATION
from tests import builders
from tests.e2e.conftest import Loop, pod_template, state_of, wait_for
from tests.e2e.test_rescheduling import events_for, failing_pod, gone, only, pods

pytestmark = pytest.mark.e2e

RETRIES = "3"


class Killed(BaseException):
    """The process died here (SIGKILL): nothing after this point runs."""


class DiesBeforeTheMovesEvent(Kube):
    """The real API server; the process dies when it is about to record a move's Event,
    i.e. right after the pod's removal went through."""

    def __init__(self, api: Kube) -> None:
        super().__init__(api._api)

    def create(self, kind: str, namespace: str | None, body: Any, **kw: Any) -> Any:
        if kind == "Event" and body.get("reason") == REASON_RESCHEDULED:
            raise Killed()
        return super().create(kind, namespace, body, **kw)


@pytest.mark.parametrize("kind", ["Deployment", "bare Pod"])
def test_a_move_whose_process_died_before_its_event_still_gets_its_event_on_redelivery(
    kind: str,
    cluster: Any,
    namespace: str,
    api: Kube,
    loop: Loop,
    faults: Callable[..., None],
) -> None:
    bad = cluster.nodes[0]
    faults("crashloop", bad)
    if kind == "Deployment":
        api.create(
            "Deployment",
            namespace,
            builders.deployment(retries=RETRIES, template=pod_template({"app": "web"}, bad)),
        )
    else:
        api.create(
            "Pod",
            namespace,
            builders.bare_pod("solo", retries=RETRIES, template=pod_template({"app": "solo"}, bad)),
        )
    pod = wait_for("a failing pod", lambda: failing_pod(api, loop, namespace))
    meta = pod["metadata"]
    event = loop.failing_event(pod)
    assert event is not None

    with pytest.raises(Killed):
        Loop(DiesBeforeTheMovesEvent(api), loop.cfg).deliver(event)
    # Everything before the death happened: the move is counted and the pod removed.
    wait_for("the pod removed", lambda: gone(api, namespace, meta["name"], meta["uid"]))
    if kind == "Deployment":
        holder = only(api, "ReplicaSet", namespace)["metadata"]["name"]
        assert state_of(api, "ReplicaSet", namespace, holder).handled == (meta["uid"],)
    else:
        holder = meta["name"]  # a bare pod's Events are about the pod itself

    # The Broker got no answer and delivers the event again (the sweep would, too).
    loop.deliver(event)
    said = events_for(api, namespace, holder, REASON_RESCHEDULED)
    assert len(said) == 1, f"a removed pod without its Rescheduled Event ({kind})"
    # ...and only once, however often the event comes back.
    loop.deliver(event)
    assert len(events_for(api, namespace, holder, REASON_RESCHEDULED)) == 1


class DiesBeforeDeleting(Kube):
    """The real API server; the process dies when it is about to delete the pod ``name``
    (for a bare pod: right after its replacement was created)."""

    def __init__(self, api: Kube, name: str) -> None:
        super().__init__(api._api)
        self.name = name

    def delete(self, kind: str, namespace: str | None, name: str, **kw: Any) -> Any:
        if kind == "Pod" and name == self.name:
            raise Killed()
        return super().delete(kind, namespace, name, **kw)


def lineage(api: Kube, namespace: str) -> list[dict[str, Any]]:
    """The live pods descending from the bare pod "solo" (itself included)."""
    return [
        p
        for p in pods(api, namespace)
        if not p["metadata"].get("deletionTimestamp")
        and (p["metadata"].get("annotations") or {}).get(ORIGIN_ANNOTATION, p["metadata"]["name"])
        == "solo"
    ]


def test_a_bare_pod_redelivered_after_its_replacement_moved_on_is_not_replaced_twice(
    cluster: Any, namespace: str, api: Kube, loop: Loop, faults: Callable[..., None]
) -> None:
    # Every node fails pods: the replacement fails too, wherever it lands.
    faults("crashloop", *cluster.nodes)
    api.create(
        "Pod",
        namespace,
        builders.bare_pod(
            "solo", retries=RETRIES, template=pod_template({"app": "solo"}, cluster.nodes[0])
        ),
    )
    solo = wait_for("solo failing", lambda: failing_pod(api, loop, namespace))
    event = loop.failing_event(solo)
    assert event is not None

    # The replacement is created, then the process dies before deleting solo.
    with pytest.raises(Killed):
        Loop(DiesBeforeDeleting(api, "solo"), loop.cfg).deliver(event)
    (child,) = [p for p in lineage(api, namespace) if p["metadata"]["name"] != "solo"]

    # The replacement fails in turn and is moved (a later event, another instance).
    def child_failing() -> Any:
        live = [p for p in pods(api, namespace) if p["metadata"]["uid"] == child["metadata"]["uid"]]
        return live and loop.failing_event(live[0])

    loop.deliver(wait_for("the replacement failing", child_failing))
    wait_for(
        "the replacement moved",
        lambda: gone(api, namespace, child["metadata"]["name"], child["metadata"]["uid"]),
    )

    # solo's own event comes back (the Broker's retry, or the sweep): it must finish removing
    # solo, not create its replacement again.
    loop.deliver(event)
    wait_for("solo removed", lambda: gone(api, namespace, "solo", solo["metadata"]["uid"]))
    names = sorted(p["metadata"]["name"] for p in lineage(api, namespace))
    assert len(names) == 1, f"one bare pod became {len(names)}: {names}"
