"""What the fuzzers feed the product: realistic objects bent out of shape, and plain hostility.

Random dicts would mostly test the first `isinstance` of each function. So pods start as the
kubelet-shaped pods of tests/unit/pods.py (crash loops, evictions, unschedulable pods, pods
stuck creating, mirror pods, bare pods...) and are then mutated a few places at a time: a key
dropped, a value of the wrong type, a huge value, an odd timestamp. That reaches every branch a
real pod reaches, with the damage one field at a time, and shrinks to the one field that
matters.
"""

from __future__ import annotations

import base64
import copy
import json
import string
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st

from shared.api.keys import (
    APISERVER_ADD,
    APISERVER_DELETE,
    APISERVER_UPDATE,
    EVENT_POD_FAILING,
    EXCLUDED_NODES_ANNOTATION,
    KSE_SCHEDULED_HOSTS_ANNOTATION,
    POLICY_ANNOTATION,
    POLICY_STAMP_ANNOTATION,
    STUCK_AFTER_ANNOTATION,
)
from shared.api.kubetypes import Pod
from shared.api.state import MAX_NODE_NAME_LENGTH
from shared.platform.config import Config
from shared.pods.failing import FailingPod
from shared.workloads.classify import classify, unschedulable_due_to_exclusions
from tests.unit import pods
from tests.unit.pods import NOW

# Keys the webhook owns on a pod; every other annotation is the user's and must survive.
OUR_POD_ANNOTATIONS = frozenset(
    {
        POLICY_STAMP_ANNOTATION,
        EXCLUDED_NODES_ANNOTATION,
        KSE_SCHEDULED_HOSTS_ANNOTATION,
        STUCK_AFTER_ANNOTATION,
    }
)


def examples(share: float) -> int:
    """A share of the profile's example budget, for properties that cost a request each."""
    return max(5, int(settings().max_examples * share))


# -- scalars ------------------------------------------------------------------------------------

# Text a user or a forged request might write: ASCII that looks like the real thing, control
# characters, and anything Unicode (surrogates excluded: they cannot travel as JSON text).
texts = st.one_of(
    st.text(string.ascii_letters + string.digits + "-._/:%+ ", max_size=20),
    st.text(st.characters(codec="utf-8"), max_size=40),
)

# Timestamps as the API server writes them, and as nobody should: offsets that push the year
# out of range once converted to UTC, dates without times, garbage.
odd_timestamps = st.one_of(
    st.builds(
        lambda moment, minutes: (
            moment.replace(tzinfo=timezone(timedelta(minutes=minutes)))
            .isoformat()
            .replace("+00:00", "Z")
        ),
        st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)),
        st.integers(-23 * 60 - 59, 23 * 60 + 59),
    ),
    # Valid RFC 3339, but out of Python's range once converted to UTC.
    st.sampled_from(
        ["0001-01-01T00:00:00+00:01", "0001-01-01T00:30:00+05:00", "9999-12-31T23:59:59-00:01"]
    ),
    st.sampled_from(
        [
            "",
            "0",
            "now",
            "2026-03-14",
            "2026-03-14T09:26:53",
            "2026-03-14T09:26:53.123456789Z",
            "2026-13-45T99:99:99Z",
            "0001-01-01T00:00:00Z",
            "0001-01-01T00:00:00+00:01",
            "9999-12-31T23:59:59Z",
            "9999-12-31T23:59:59-00:01",
            "1970-01-01T00:00:00Z",
            "2026-03-14T09:26:53+14:00",
        ]
    ),
)

huge_values = st.one_of(
    st.integers(min_value=2**31, max_value=2**70) | st.integers(max_value=-1),
    st.just(10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(1, 300_000).map(lambda n: "x" * n),
    st.integers(1, 2_000).map(lambda n: ["node-a"] * n),
)

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), texts)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(texts, children, max_size=4),
    max_leaves=12,
)


def nested(depth: int, leaf: str = "0") -> str:
    """JSON text nested ``depth`` arrays deep: valid JSON, and a stack-depth bomb when deep."""
    return "[" * depth + leaf + "]" * depth


# Depths around what Python's json and anything recursive over its result can take.
depths = st.sampled_from([1, 10, 100, 400, 800, 950, 1_000, 2_000, 100_000])

# -- node names ---------------------------------------------------------------------------------

_LABEL = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)
valid_node_names = st.one_of(
    st.sampled_from(["node-a", "node-b", "node-c", "ip-10-0-0-12.eu-west-1.compute.internal"]),
    st.lists(_LABEL, min_size=1, max_size=4).map(".".join),
    # Right at the limit: 253 characters.
    st.just(".".join(["a" * 63] * 3 + ["b" * 61])),
).filter(lambda name: len(name) <= MAX_NODE_NAME_LENGTH)
invalid_node_names = st.one_of(
    st.sampled_from(
        [
            "",
            "Node-A",
            "node_a",
            "-node",
            "node-",
            "node..a",
            ".node",
            "node-a\n",
            " node-a",
            "nöde",
            "a" * 254,
            "node-a/..",
        ]
    ),
    texts,
)
node_names = st.one_of(valid_node_names, invalid_node_names)

# -- pods ---------------------------------------------------------------------------------------

# A realistic pod of every kind the classifier and the webhook meet, built lazily (each draw
# gets a fresh copy).
POD_BUILDERS: tuple[Callable[[], Pod], ...] = (
    pods.pod,
    lambda: pods.pod(containers=[pods.crash_looping(restarts=4)], excluded=["node-a"]),
    lambda: pods.pod(containers=[pods.crash_looping(restarts=9, last_reason="OOMKilled")]),
    lambda: pods.no_memory_limit(
        pods.pod(
            containers=[pods.crash_looping(restarts=1, last_reason="OOMKilled", exit_code=137)]
        )
    ),
    lambda: pods.pod(
        containers=[pods.running(restarts=2, last=pods.last_terminated("OOMKilled", 137))]
    ),
    lambda: pods.pod(
        containers=[pods.waiting("ErrImagePull", "failed to pull: dial tcp: i/o timeout")]
    ),
    lambda: pods.pod(containers=[pods.waiting("ImagePullBackOff", 'image "x": not found')]),
    lambda: pods.pod(containers=[pods.waiting("CreateContainerConfigError", "no secret")]),
    lambda: pods.pod(
        containers=[pods.waiting("RunContainerError", 'exec: "/app": no such file or directory')]
    ),
    lambda: pods.pod(
        phase="Pending",
        init_containers=[pods.crash_looping("init", restarts=5)],
        containers=[pods.waiting("PodInitializing")],
    ),
    lambda: pods.pod(
        phase="Failed",
        containers=[pods.terminated("OOMKilled", 137)],
        owner=("Job", "nightly-28391"),
    ),
    pods.evicted,
    lambda: pods.evicted(owner=None, annotations={POLICY_ANNOTATION: "2"}),
    lambda: pods.unschedulable(excluded=["node-a", "node-b"]),
    lambda: pods.pending_on_node(timedelta(minutes=15)),
    lambda: pods.pending_on_node(timedelta(hours=2), kubelet_seen=False),
    lambda: pods.sandbox_ready_since(
        pods.pending_on_node(timedelta(hours=3)), NOW - timedelta(hours=2)
    ),
    pods.mirror,
    lambda: pods.pod(
        "db-0",
        owner=("StatefulSet", "db"),
        containers=[pods.crash_looping(restarts=6, pod_name="db-0")],
    ),
    lambda: pods.pod(owner=("DaemonSet", "agent"), containers=[pods.crash_looping(restarts=8)]),
    lambda: pods.pod(deleting=True, containers=[pods.crash_looping(restarts=8)]),
    lambda: pods.pod(stamp="0", containers=[pods.crash_looping(restarts=8)]),
    lambda: pods.pod(stamp="three", containers=[pods.crash_looping(restarts=8)]),
    lambda: pods.pod(
        stamp=None,
        annotations={STUCK_AFTER_ANNOTATION: "5m"},
        containers=[pods.waiting("ContainerCreating")],
        phase="Pending",
    ),
)

realistic_pods = st.sampled_from(POD_BUILDERS).map(lambda build: build())


def paths_in(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place inside a JSON value, parents before children."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*prefix, key)
            yield from paths_in(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield (*prefix, index)
            yield from paths_in(item, (*prefix, index))


def parent_of(value: Any, path: tuple[Any, ...]) -> Any:
    for step in path[:-1]:
        value = value[step]
    return value


_TIME_KEYS = ("At", "Time", "Timestamp")

# Replacements for one field: another type, absurd sizes, odd timestamps, nothing at all.
replacements = st.one_of(json_values, huge_values, odd_timestamps, st.none())


def same_type(value: Any, key: object = None) -> st.SearchStrategy[Any]:
    """Another value of the type ``value`` has: what a real API server could still send
    (its objects are typed), only with contents nobody expected. A timestamp field gets odd
    timestamps."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.integers(min_value=-(2**63), max_value=2**63 - 1)
    if isinstance(value, str) and isinstance(key, str) and key.endswith(_TIME_KEYS):
        return odd_timestamps
    if isinstance(value, str):
        return st.one_of(texts, odd_timestamps, st.integers(1, 300_000).map(lambda n: "x" * n))
    if isinstance(value, list):
        return st.just(value[: len(value) // 2])
    if isinstance(value, dict):
        return st.just({})
    return st.just(value)


@st.composite
def mutated(
    draw: st.DrawFn, base: st.SearchStrategy[Any], max_mutations: int = 5, well_typed: bool = False
) -> Any:
    """A value from ``base`` with a few fields dropped or replaced: by anything, or with
    ``well_typed`` by a value of the same JSON type."""
    value = copy.deepcopy(draw(base))
    for _ in range(draw(st.integers(0, max_mutations))):
        places = list(paths_in(value))
        if not places:
            break
        # Most decisions read the status and the annotations: aim there more often than not.
        focus = [p for p in places if p[0] == "status" or p[:2] == ("metadata", "annotations")]
        if focus and draw(st.integers(0, 2)):
            places = focus
        path = draw(st.sampled_from(places))
        parent = parent_of(value, path)
        if draw(st.booleans()):
            if isinstance(parent, list) and well_typed:
                continue  # a list keeps its items' type: shortened instead, above it
            del parent[path[-1]]
        else:
            old = parent[path[-1]]
            parent[path[-1]] = draw(same_type(old, path[-1]) if well_typed else replacements)
    return value


mutated_pods = mutated(realistic_pods)
# Pods a real API server could send: every field of its type, contents anything.
well_typed_pods = mutated(realistic_pods, well_typed=True)


def realistic_failing_data() -> list[dict[str, Any]]:
    """The data of io.kn-rescheduler.pod.failing events detect-failures sends for the
    failing pods above (computed once, with the pods' own clock)."""
    found = []
    for build in POD_BUILDERS:
        pod = build()
        failure = unschedulable_due_to_exclusions(pod, Config()) or classify(
            pod, Config(), NOW + timedelta(hours=4)
        )
        if failure is not None:
            found.append(FailingPod.from_pod(pod, failure).to_data())
    return found


FAILING_DATA = realistic_failing_data()
failing_data = mutated(st.sampled_from(FAILING_DATA), max_mutations=3)

# -- CloudEvents --------------------------------------------------------------------------------

KNOWN_POD_TYPES = st.sampled_from([APISERVER_ADD, APISERVER_UPDATE])
KNOWN_TYPES = st.sampled_from(
    [APISERVER_ADD, APISERVER_UPDATE, APISERVER_DELETE, EVENT_POD_FAILING, "dev.knative.x"]
)
# Header values travel as latin-1 over HTTP; CR and LF would end the header.
header_text = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"),
    max_size=30,
)
header_names = st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,20}", fullmatch=True)
CONTENT_TYPES = st.one_of(
    st.sampled_from(
        [
            "application/json",
            "application/json; charset=utf-8",
            "text/json",
            "text/plain",
            "application/octet-stream",
            "application/cloudevents+json",
            "application/cloudevents-batch+json",
            "",
        ]
    ),
    header_text,
)


def _as_bytes(data: Any) -> bytes:
    return json.dumps(data, allow_nan=True).encode()


# The body of an event: the JSON of a (damaged) pod or failing-pod data, any JSON, any bytes,
# nesting bombs, and sizes far past anything the API server sends.
def event_bodies(data: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    return st.one_of(
        data.map(_as_bytes),
        json_values.map(_as_bytes),
        st.binary(max_size=200),
        depths.map(lambda depth: nested(depth).encode()),
        # A pod whose labels are a deep list: past the first checks, then deep.
        depths.map(
            lambda depth: (
                '{"metadata": {"name": "p", "namespace": "shop", "labels": ' + nested(depth) + "}}"
            ).encode()
        ),
        st.integers(1, 6).map(lambda mib: b'{"pad": "' + b"x" * (mib * 1024 * 1024) + b'"}'),
        st.just(b""),
    )


@st.composite
def binary_events(draw: st.DrawFn, data: st.SearchStrategy[Any]) -> tuple[dict[str, str], bytes]:
    """A binary-mode CloudEvent (attributes in ce- headers), its attributes often wrong."""
    headers: dict[str, str] = {}
    attributes = {
        "specversion": st.sampled_from(["1.0", "1.0", "1.0", "0.3", "2.0", ""]) | header_text,
        "id": st.uuids().map(str) | header_text,
        "source": st.just("https://10.96.0.1:443") | header_text,
        "type": KNOWN_TYPES | header_text,
        "subject": st.just("/apis/v1/namespaces/shop/pods/web-7d9c8b6f4-x2x9z") | header_text,
        "kind": st.sampled_from(["Pod", "ReplicaSet"]) | header_text,
        "time": odd_timestamps.filter(lambda t: t.isascii()),
        "knrdryrun": st.sampled_from(["true", "false"]),
    }
    for name, values in attributes.items():
        # The ones every event needs are usually there; the rest now and then.
        usually = name in ("specversion", "id", "source", "type")
        if draw(st.integers(0, 9)) < (9 if usually else 4):
            headers[f"ce-{name}"] = draw(values)
    for _ in range(draw(st.integers(0, 3))):
        prefix = draw(st.sampled_from(["ce-", "Ce-", "CE-", "x-", ""]))
        headers[prefix + draw(header_names)] = draw(header_text)
    if draw(st.integers(0, 9)) < 8:
        headers["content-type"] = draw(CONTENT_TYPES)
    return headers, draw(event_bodies(data))


@st.composite
def structured_events(
    draw: st.DrawFn, data: st.SearchStrategy[Any]
) -> tuple[dict[str, str], bytes]:
    """A structured-mode CloudEvent (one JSON object), often broken."""
    envelope: dict[str, Any] = {
        "specversion": draw(st.sampled_from(["1.0", "1.0", "0.3", "9"]) | json_values),
        "id": draw(st.uuids().map(str) | json_values),
        "source": draw(st.just("https://10.96.0.1:443") | json_values),
        "type": draw(KNOWN_TYPES | json_values),
        "datacontenttype": draw(CONTENT_TYPES | json_values),
        "kind": draw(st.sampled_from(["Pod", "Job"]) | json_values),
    }
    for key in draw(st.lists(st.sampled_from(sorted(envelope)), max_size=3)):
        envelope.pop(key, None)
    if draw(st.booleans()):
        envelope["data"] = draw(data | json_values)
    elif draw(st.booleans()):
        envelope["data_base64"] = draw(
            st.binary(max_size=50).map(lambda b: base64.b64encode(b).decode()) | json_values
        )
    envelope.update(draw(st.dictionaries(header_names.map(str.lower), json_values, max_size=3)))
    content_type = draw(
        st.sampled_from(
            ["application/cloudevents+json", "application/cloudevents+json; charset=utf-8"]
        )
        | CONTENT_TYPES
    )
    body = draw(
        st.one_of(
            st.just(envelope).map(_as_bytes),
            st.just(envelope).map(_as_bytes).map(lambda b: b[: len(b) // 2]),
            event_bodies(data),
        )
    )
    return {"content-type": content_type}, body


def cloudevents(data: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[dict[str, str], bytes]]:
    return st.one_of(binary_events(data), structured_events(data))


def wellformed_events(
    event_types: st.SearchStrategy[str], data: st.SearchStrategy[Any]
) -> st.SearchStrategy[tuple[dict[str, str], bytes]]:
    """A correct binary-mode event around ``data``: what a Broker delivers."""
    return st.tuples(st.uuids(), event_types, data).map(
        lambda drawn: (
            {
                "ce-specversion": "1.0",
                "ce-id": str(drawn[0]),
                "ce-source": "https://10.96.0.1:443",
                "ce-type": drawn[1],
                "ce-kind": "Pod",
                "content-type": "application/json",
            },
            _as_bytes(drawn[2]),
        )
    )


def utc_seconds() -> st.SearchStrategy[datetime]:
    """Aware UTC datetimes at second precision (what the API server and our state store),
    the whole range RFC 3339 allows."""
    return st.datetimes(
        min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)
    ).map(lambda moment: moment.replace(microsecond=0, tzinfo=UTC))
