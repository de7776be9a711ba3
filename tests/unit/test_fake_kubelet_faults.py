"""The fake kubelet's memory of each node's fault label over time (dev/localcluster/kubelet.py):
a pod's fault is its node's at the pod's binding, answered without an exact-revision LIST of
every Node. Nodes shaped as the API server returns them (a resourceVersion that is etcd's
revision, labels that come and go)."""

from __future__ import annotations

import threading
from typing import Any

from dev.localcluster.keys import SIM_FAULT_LABEL
from dev.localcluster.kubelet import _NodeFaults


def node(name: str, rv: int, fault: str | None = None, **labels: str) -> dict[str, Any]:
    if fault is not None:
        labels[SIM_FAULT_LABEL] = fault
    return {"metadata": {"name": name, "resourceVersion": str(rv), "labels": labels}}


def test_a_pod_bound_before_its_node_was_healed_gets_the_fault_it_was_bound_under() -> None:
    faults = _NodeFaults()
    faults.record(node("node-2", 100, "createcontainer"))
    faults.record(node("node-2", 130))  # healed
    assert faults.fault_at("node-2", 120, 130, timeout=0) == (True, "createcontainer")
    assert faults.fault_at("node-2", 130, 130, timeout=0) == (True, None)
    assert faults.fault_at("node-2", 200, 130, timeout=0) == (True, None)


def test_changes_to_other_labels_and_status_keep_one_entry_per_fault_change() -> None:
    faults = _NodeFaults()
    faults.record(node("node-1", 100, "crashloop"))
    for rv in range(101, 150):  # heartbeats, usage annotations, other labels
        faults.record(node("node-1", rv, "crashloop", zone="a"))
    faults.record(node("node-1", 150))
    assert faults.history["node-1"] == [(100, "crashloop"), (150, None)]
    assert faults.fault_at("node-1", 149, 150, timeout=0) == (True, "crashloop")


def test_a_revision_before_the_watch_knew_the_node_is_not_answered() -> None:
    faults = _NodeFaults()
    faults.record(node("node-1", 100, "imagepull"))
    # The caller then asks the API server for the node at that exact revision.
    assert faults.fault_at("node-1", 99, 100, timeout=0) == (False, None)
    assert faults.fault_at("node-9", 99, 100, timeout=0) == (False, None)


def test_the_answer_waits_for_the_watch_to_reach_the_nodes_revision_read_just_now() -> None:
    faults = _NodeFaults()
    faults.record(node("node-1", 100))
    # The GET saw revision 140 (the fault set at 140): the watch has not delivered it yet.
    assert faults.fault_at("node-1", 150, 140, timeout=0) == (False, None)
    late = threading.Timer(0.1, faults.record, args=(node("node-1", 140, "oom"),))
    late.start()
    assert faults.fault_at("node-1", 150, 140, timeout=5) == (True, "oom")
    late.join()


def test_a_new_list_forgets_what_happened_while_no_watch_ran() -> None:
    faults = _NodeFaults()
    faults.record(node("node-1", 100, "crashloop"))
    faults.restart()
    faults.record(node("node-1", 300))
    assert faults.fault_at("node-1", 200, 300, timeout=0) == (False, None)
