"""Kubernetes resource quantities ("250m", "1.5", "512Mi", "1e3", "2G") as numbers.

The client's own parser lives beside its API client; product code outside shared.platform.kube
does not import that package, and what the load-aware functions need is small: CPU in
millicores and memory in bytes, from the canonical forms the API server writes (it normalises
quantities on write: "0.5" comes back as "500m", "1Gi" stays "1Gi") and from what users type.
Grammar: apimachinery's resource.Quantity (a signed decimal, then a binary suffix Ki..Ei, a
decimal suffix n, u, m, "", k, M, G, T, P, E, or an exponent e/E and an integer).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from typing import Final

_BINARY: Final = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL: Final = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_FORM: Final = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))((?:[KMGTPE]i)|[eE][+-]?\d+|[numkMGTPE]?)$")


class QuantityError(ValueError):
    """Not a Kubernetes resource quantity."""


def parse(raw: object) -> Decimal:
    """The quantity's value in base units (cores, bytes)."""
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise QuantityError(f"not a quantity: {raw!r}")
    if isinstance(raw, int | float):
        if isinstance(raw, float) and not math.isfinite(raw):
            raise QuantityError(f"not a quantity: {raw!r}")
        return Decimal(str(raw))
    match = _FORM.match(raw.strip())
    if match is None:
        raise QuantityError(f"not a quantity: {raw!r}")
    number, suffix = match.groups()
    try:
        value = Decimal(number)
        if suffix in _BINARY:
            return value * _BINARY[suffix]
        if suffix[:1] in ("e", "E"):
            return value.scaleb(int(suffix[1:]))
        return value * _DECIMAL[suffix]
    except (InvalidOperation, KeyError, ValueError) as err:  # pragma: no cover - regex guards
        raise QuantityError(f"not a quantity: {raw!r}") from err


def millicores(raw: object) -> int:
    """CPU in millicores, rounded up as the API server rounds sub-milli CPU ("0.1m" is 1m)."""
    return math.ceil(parse(raw) * 1000)


def bytes_of(raw: object) -> int:
    """Memory in bytes, rounded up."""
    return math.ceil(parse(raw))
