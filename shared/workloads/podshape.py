"""Is this JSON shaped like a pod the API server could have sent? (Only the parts we read.)

The decision code reads pods as plain JSON (`shared.api.kubetypes` describes them, it does not
check them). A pod that came from the API server always has the right types, but a pod event is
only a CloudEvent: a forged or corrupted one can carry `"status": "Running"` or
`"containerStatuses": [null]`, and code written for real pods would crash on it (a 500 that
Knative retries for nothing). So the entry points check the shape of what they are about to
read once, here, and treat anything else as malformed (detect-failures answers 400, the sweep
and the classifier leave it alone).

What the API server really writes decides the rules: objects and lists are omitted when empty,
never null (Go's `omitempty` on maps, slices and pointers; container states are structs that
are always objects); only timestamps of a zero `metav1.Time` come as null (a new pod's
`creationTimestamp` in an AdmissionReview, a terminated state's `startedAt`). So a timestamp
may be null; anything else, when present, has its type. Fields we never read are not checked.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Concatenate, Final, ParamSpec, TypeVar

# A shape is a type for a leaf, a dict of field shapes for an object, a one-item list for a
# list of that shape, MAP_OF_STR for a string-to-string map (labels, annotations), or TIME for
# a timestamp: the only leaf the API server writes as null (a zero metav1.Time).
MAP_OF_STR: Final = "map[string]string"
TIME: Final = "timestamp"

_STATE: Final[dict[str, Any]] = {
    "waiting": {"reason": str, "message": str},
    "running": {"startedAt": TIME},
    "terminated": {
        "reason": str,
        "message": str,
        "exitCode": int,
        "startedAt": TIME,
        "finishedAt": TIME,
    },
}
_CONTAINER_STATUS: Final[dict[str, Any]] = {
    "name": str,
    "restartCount": int,
    "state": _STATE,
    "lastState": _STATE,
}
_CONTAINER: Final[dict[str, Any]] = {"name": str, "image": str, "resources": {"limits": {}}}
POD_SHAPE: Final[dict[str, Any]] = {
    "metadata": {
        "name": str,
        "generateName": str,
        "namespace": str,
        "uid": str,
        "creationTimestamp": TIME,
        "deletionTimestamp": TIME,
        "labels": MAP_OF_STR,
        "annotations": MAP_OF_STR,
        "ownerReferences": [
            {"apiVersion": str, "kind": str, "name": str, "uid": str, "controller": bool}
        ],
    },
    "spec": {
        "nodeName": str,
        "restartPolicy": str,
        "containers": [_CONTAINER],
        "initContainers": [_CONTAINER],
        "resources": {"limits": {}},
        "affinity": {},
    },
    "status": {
        "phase": str,
        "reason": str,
        "message": str,
        "startTime": TIME,
        "conditions": [
            {"type": str, "status": str, "reason": str, "message": str, "lastTransitionTime": TIME}
        ],
        "containerStatuses": [_CONTAINER_STATUS],
        "initContainerStatuses": [_CONTAINER_STATUS],
    },
}


class MalformedPod(ValueError):
    """The object handed to the decision code is not shaped like a pod (see `malformed`)."""


# What reading a wrongly typed field raises in code written for real pods.
_SHAPE_ERRORS: Final = (AttributeError, TypeError, KeyError, IndexError)


@contextlib.contextmanager
def judged(pod: object) -> Iterator[None]:
    """Run decision code on ``pod``; if it trips over a field of the wrong type, raise
    MalformedPod saying which. Checking the shape only after a failure keeps the hot path (every
    pod event) free of it; a crash on a pod of the right shape is our bug and is re-raised."""
    try:
        yield
    except _SHAPE_ERRORS as exc:
        problem = malformed(pod)
        if problem is None:
            raise
        raise MalformedPod(problem) from exc


P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


def judges_pod(func: Callable[Concatenate[T, P], R]) -> Callable[Concatenate[T, P], R]:
    """`judged` around a function whose first argument is the pod."""

    @functools.wraps(func)
    def wrapper(pod: T, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with judged(pod):
            return func(pod, *args, **kwargs)

    return wrapper


def malformed(pod: object) -> str | None:
    """Where ``pod`` departs from what the API server writes, or None when it does not."""
    return _check(pod, POD_SHAPE, "pod")


def _check(value: object, shape: Any, where: str) -> str | None:
    if isinstance(shape, dict):
        if not isinstance(value, Mapping):
            return f"{where} must be an object, not {_kind(value)}"
        for key, inner in shape.items():
            if key in value:
                # Only a timestamp may be null: Go's omitempty leaves anything else out.
                problem = _check(value[key], inner, f"{where}.{key}")
                if problem:
                    return problem
        return None
    if isinstance(shape, list):
        if not isinstance(value, list):
            return f"{where} must be a list, not {_kind(value)}"
        for index, item in enumerate(value):
            problem = _check(item, shape[0], f"{where}[{index}]")
            if problem:
                return problem
        return None
    if shape == TIME:
        return None if value is None or isinstance(value, str) else f"{where} must be a time"
    if shape == MAP_OF_STR:
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            return f"{where} must map strings to strings"
        return None
    if shape is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, shape)
    return None if ok else f"{where} must be {shape.__name__}, not {_kind(value)}"


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__
