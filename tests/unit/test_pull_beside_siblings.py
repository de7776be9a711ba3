"""A pull that never ends on one node while another pod of the same controller downloaded the
same image elsewhere: stuck after pending_stuck_after (or three times that download), not
pull_stuck_after.

What a node-local registry mirror that accepts connections and never answers leaves on a real
node (tests/fixtures/real-kubelet/image-pull-hangs.json): ContainerCreating with the sandbox
up, one Pulling Event, no error and no timeout, while the same image downloads in seconds on
the other nodes. The pod's status alone cannot tell that from a big image pulled slowly; the
kubelets' ``Pulled`` Events about its siblings can, when they say a download happened and how
long it took. A sibling that found the image already on its node ("already present on
machine"), or that only restarted since, says nothing about how long a download takes.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from shared.api.kubetypes import Pod
from shared.platform.config import Config
from shared.pods.sweep_failures.handler import find_failures
from shared.workloads.classify import STUCK_PENDING, Failure, started_containers, stuck_pending
from shared.workloads.podevents import image_pulls

from . import pods
from .pods import IMAGE, NOW, kubelet_event, running

CFG = Config()
SANDBOX_UP = NOW - timedelta(minutes=11)
FIXTURES = Path(__file__).parents[1] / "fixtures" / "real-kubelet"


def pulling(name: str = "web-7d9c8b6f4-pull1", node: str = "node-b") -> Pod:
    """Bound to ``node``, its sandbox up 11 minutes ago, its container still being created."""
    return pods.sandbox_ready_since(
        pods.pending_on_node(timedelta(minutes=11), name=name, node=node), SANDBOX_UP
    )


def sibling(node: str = "node-c", started: timedelta = timedelta(minutes=10), **kw: Any) -> Pod:
    """Another pod of the same ReplicaSet, its container started ``started`` ago."""
    return pods.pod(
        "web-7d9c8b6f4-ok001", node=node, containers=[running(started=NOW - started)], **kw
    )


def downloaded(p: Pod, took: str = "40.512s", *, ago: timedelta, image: str = IMAGE) -> Any:
    """The kubelet's Pulled Event for a download of ``image`` for ``p``, ``ago`` before NOW."""
    message = (
        f'Successfully pulled image "{image}" in {took} ({took} including waiting). '
        "Image size: 48213504 bytes."
    )
    return kubelet_event(p, "Pulled", message, at=NOW - ago)


def already_present(p: Pod, *, ago: timedelta) -> Any:
    message = f'Container image "{IMAGE}" already present on machine'
    return kubelet_event(p, "Pulled", message, at=NOW - ago)


def judged(
    stuck: Pod, *others: Pod, events: list[Any], at: Any = NOW, queue: Any = ()
) -> Failure | None:
    """``stuck`` judged beside ``others`` and the kubelets' Events; ``queue``: when the other
    pods on its node began waiting for their images."""
    started = [s for other in others for s in started_containers(other)]
    return stuck_pending(
        stuck,
        CFG,
        at,
        started_elsewhere=started,
        pulls=image_pulls(events),
        pulling_on_node=queue,
    )


def test_a_pull_whose_image_a_sibling_downloaded_elsewhere_since_is_stuck_after_ten_minutes() -> (
    None
):
    ok = sibling()
    failure = judged(pulling(), ok, events=[downloaded(ok, ago=timedelta(minutes=10))])
    assert failure is not None and failure.reason == STUCK_PENDING
    assert "node-c" in failure.why and "40s" in failure.why and failure.node == "node-b"


def test_without_siblings_the_same_pull_has_its_hour() -> None:
    assert stuck_pending(pulling(), CFG, NOW) is None
    assert stuck_pending(pulling(), CFG, SANDBOX_UP + CFG.pull_stuck_after) is not None


def test_a_sibling_that_found_the_image_on_its_node_proves_nothing_about_a_download() -> None:
    # The lookalike: a 20 GB image still downloading after 10 minutes on a healthy node, beside
    # siblings on nodes that had it cached. Their kubelets wrote "already present on machine".
    ok = sibling()
    events = [already_present(ok, ago=timedelta(minutes=10))]
    assert judged(pulling(), ok, events=events) is None
    assert judged(pulling(), ok, events=events, at=SANDBOX_UP + CFG.pull_stuck_after) is not None


def test_a_sibling_that_only_restarted_since_the_pull_began_says_nothing_about_it() -> None:
    # Its download was before this pod's sandbox came up; its container restarted since.
    ok = pods.pod(
        "web-7d9c8b6f4-ok001",
        node="node-c",
        containers=[running(started=NOW - timedelta(minutes=2), restarts=3)],
    )
    assert judged(pulling(), ok, events=[downloaded(ok, ago=timedelta(hours=2))]) is None


def test_a_slow_download_elsewhere_gives_this_pull_three_times_as_long() -> None:
    ok = sibling()
    events = [downloaded(ok, "8m0.250s", ago=timedelta(minutes=2))]
    slow = pods.sandbox_ready_since(
        pods.pending_on_node(timedelta(minutes=23), name="web-7d9c8b6f4-pull1"),
        NOW - timedelta(minutes=23),
    )
    assert judged(slow, ok, events=events) is None
    failure = judged(slow, ok, events=events, at=NOW + timedelta(minutes=1, seconds=1))
    assert failure is not None and "8m0s" in failure.why and "threshold 24m0s" in failure.why


def test_a_sibling_on_the_same_node_is_no_evidence_against_it() -> None:
    same = sibling(node="node-b")
    assert judged(pulling(), same, events=[downloaded(same, ago=timedelta(minutes=10))]) is None


def test_a_pod_of_another_controller_is_no_sibling() -> None:
    other = sibling(owner=("ReplicaSet", "api-5f6d7c8b9"))
    assert judged(pulling(), other, events=[downloaded(other, ago=timedelta(minutes=10))]) is None


def test_a_download_of_another_image_is_no_evidence() -> None:
    ok = sibling()
    events = [downloaded(ok, ago=timedelta(minutes=10), image="registry.example.com/other:1")]
    assert judged(pulling(), ok, events=events) is None


def test_under_ten_minutes_even_a_quick_download_elsewhere_leaves_a_pull_in_progress() -> None:
    young = pods.sandbox_ready_since(
        pods.pending_on_node(timedelta(minutes=3), name="web-7d9c8b6f4-pull1"),
        NOW - timedelta(minutes=3),
    )
    ok = sibling(started=timedelta(minutes=2))
    assert judged(young, ok, events=[downloaded(ok, ago=timedelta(minutes=2))]) is None


def untagged(p: Pod) -> Pod:
    """``p`` with its container's image written without a tag, as many manifests do."""
    for container in p["spec"]["containers"]:
        container["image"] = "busybox"
    for status in p["status"].get("containerStatuses") or []:
        status["image"] = "docker.io/library/busybox:latest"
    return p


@pytest.mark.parametrize(
    ("message", "counts"),
    [
        # kubelet v1.30+: the reference with the default tag applied, and the image size.
        (
            'Successfully pulled image "busybox:latest" in 1.2s (1.2s including waiting). '
            "Image size: 2155574 bytes.",
            True,
        ),
        # v1.29: the spec's text as written, and the size.
        (
            'Successfully pulled image "busybox" in 1.2s (1.2s including waiting). '
            "Image size: 2155574 bytes.",
            True,
        ),
        # v1.26-v1.28: no size, so no telling a download from layers found on the node.
        ('Successfully pulled image "busybox" in 1.2s (1.2s including waiting)', False),
        # before v1.26: the pull time alone.
        ('Successfully pulled image "busybox" in 1.2s', False),
    ],
)
def test_a_download_counts_when_the_kubelet_says_how_big_it_was(message: str, counts: bool) -> None:
    ok = untagged(sibling())
    event = kubelet_event(ok, "Pulled", message, at=NOW - timedelta(minutes=10))
    assert (judged(untagged(pulling()), ok, events=[event]) is not None) is counts


def test_a_pull_of_gigabytes_in_milliseconds_found_the_layers_on_the_node() -> None:
    # imagePullPolicy Always: every start "pulls", and a node that has the layers only
    # resolves the manifest. No evidence of how long a download of 20 GB takes.
    ok = sibling()
    cached = downloaded(ok, "312ms", ago=timedelta(minutes=10)) | {
        "message": f'Successfully pulled image "{IMAGE}" in 312ms (312ms including waiting). '
        "Image size: 21474836480 bytes."
    }
    assert judged(pulling(), ok, events=[cached]) is None


def first_uid(recorded: Any) -> str:
    return str(recorded["pod"]["metadata"]["uid"])


def test_the_recorded_kubelets_download_reads_as_the_image_node_and_time_it_says() -> None:
    # A crash-looping container under imagePullPolicy Always: one pull per start.
    recorded = json.loads((FIXTURES / "crashloop.json").read_text())
    pulls = image_pulls(recorded["events"])
    assert list(pulls) == [recorded["pod"]["metadata"]["uid"]]
    first = pulls[recorded["pod"]["metadata"]["uid"]][0]
    assert (first.container, first.image, first.node, first.size) == (
        "app",
        "kn-rescheduler.local/busybox:1.35",
        "real-1",
        1088866,
    )
    assert first.took == timedelta(milliseconds=572)
    assert [p.took.total_seconds() for p in pulls[first_uid(recorded)]] == [
        0.572,
        0.087,
        0.106,
        0.244,
        0.039,
    ]


def test_the_sweep_finds_it_whichever_page_the_sibling_is_on() -> None:
    ok = sibling()
    events = [downloaded(ok, ago=timedelta(minutes=10))]
    for order in ([pulling(), ok], [ok, pulling()]):
        found = find_failures(order, CFG, NOW, pulls=lambda: image_pulls(events))
        assert [(f.name, f.failure.reason) for f in found] == [
            ("web-7d9c8b6f4-pull1", STUCK_PENDING)
        ]


def test_the_sweep_reads_the_downloads_only_for_a_pull_with_a_sibling_started_elsewhere() -> None:
    def never() -> Any:
        raise AssertionError("read the image pulls with no pull to judge")

    assert find_failures([sibling(), pods.pod("web-7d9c8b6f4-ok002")], CFG, NOW, pulls=never) == []
    assert find_failures([pulling()], CFG, NOW, pulls=never) == []


def two_containers(p: Pod, first: str, image: str, *, init: bool = False) -> Pod:
    """``p`` with a container ``first`` (image ``image``) before its own: a sidecar or an
    init container, the kubelet's first pull."""
    key = "initContainers" if init else "containers"
    spec = p["spec"]
    spec[key] = [{"name": first, "image": image}, *(spec.get(key) or [])]
    return p


def test_a_download_of_another_containers_image_says_nothing_about_the_pull_under_way() -> None:
    # The kubelet pulls the first container's image first (a 20 GB model); every container
    # shows ContainerCreating meanwhile. The sibling downloaded only the app's small image.
    model = "registry.example.com/shop/model:7"
    stuck = two_containers(pulling(), "model", model)
    ok = two_containers(sibling(), "model", model)
    events = [downloaded(ok, "2.1s", ago=timedelta(minutes=10))]
    assert judged(stuck, ok, events=events) is None
    # An init container's image is pulled before any app container's.
    first = two_containers(pulling(), "fetch", model, init=True)
    assert judged(first, ok, events=events) is None


def test_a_pull_queued_behind_another_pods_on_its_node_is_not_judged_early() -> None:
    ok = sibling()
    events = [downloaded(ok, ago=timedelta(minutes=10))]
    assert judged(pulling(), ok, events=events, queue=[SANDBOX_UP - timedelta(minutes=2)]) is None
    # A pod that began waiting after this one is behind it, not ahead.
    behind = [SANDBOX_UP + timedelta(minutes=1)]
    assert judged(pulling(), ok, events=events, queue=behind) is not None


def test_a_big_images_pull_keeps_the_time_its_size_needs_at_ten_mebibytes_a_second() -> None:
    # A sibling that had most layers "pulls" 20 GiB in 25 s (under the 1 GiB/s cache-hit rate):
    # it proves the registry answers, not that 20 GiB come in 10 minutes.
    ok = sibling()
    big = {
        **downloaded(ok, "25s", ago=timedelta(minutes=10)),
        "message": f'Successfully pulled image "{IMAGE}" in 25s (25s including waiting). '
        "Image size: 21474836480 bytes.",
    }
    assert judged(pulling(), ok, events=[big]) is None
    failure = judged(pulling(), ok, events=[big], at=SANDBOX_UP + timedelta(minutes=35))
    assert failure is not None and "threshold 34m8s" in failure.why


def test_the_sweep_holds_back_a_pull_queued_behind_another_pods_on_its_node() -> None:
    ok = sibling()
    events = [downloaded(ok, ago=timedelta(minutes=10))]
    earlier = pods.sandbox_ready_since(
        pods.pending_on_node(
            timedelta(minutes=13),
            name="batch-6b8d9c7f5-big01",
            owner=("ReplicaSet", "batch-6b8d9c7f5"),
        ),
        SANDBOX_UP - timedelta(minutes=2),
    )
    found = find_failures([pulling(), ok, earlier], CFG, NOW, pulls=lambda: image_pulls(events))
    assert "web-7d9c8b6f4-pull1" not in [f.name for f in found]
