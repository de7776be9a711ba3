"""The one allowance the fuzzers make the decision code: a pod no API server could have sent
(a field of the wrong type, in a forged or corrupted event) may be refused as malformed.

The decision functions of shared.workloads.classify raise
`shared.workloads.podshape.MalformedPod` when they trip over such a field; detect-failures
answers 400 for it and the sweep skips the pod. The fuzzers hold them to exactly that: MalformedPod
only for a pod drawn with fields of any type, only when `malformed` names the field, and never
another exception, for any pod.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from hypothesis import event

from shared.platform import events
from shared.workloads.podshape import MalformedPod, malformed


@contextlib.contextmanager
def refusing_only_malformed(pod: object, ill_typed: bool) -> Iterator[None]:
    """Let the decision code inside refuse ``pod`` as malformed when ``ill_typed`` (it was
    drawn with fields of any type) and the shape check agrees; anything else it raises fails."""
    try:
        yield
    except MalformedPod as error:
        assert ill_typed, f"a pod of the API server's types refused as malformed: {error}"
        assert malformed(pod) is not None, f"refused as malformed, yet well shaped: {error}"
        event("refused as malformed")


def refused_as_malformed(error: events.BadEvent, pod: object, ill_typed: bool) -> bool:
    """Whether detect refused ``pod`` for its shape (checked as above) or for something else
    (no name, namespace or uid; not an object)."""
    if not isinstance(error.__cause__, MalformedPod):
        return False
    assert ill_typed, f"a pod of the API server's types refused as malformed: {error}"
    assert malformed(pod) is not None, f"refused as malformed, yet well shaped: {error}"
    return True
