"""Resource quantities as the API server writes them (and as people type them) become
millicores and bytes; anything else is refused."""

from __future__ import annotations

import pytest

from shared.api import quantity


@pytest.mark.parametrize(
    ("raw", "millicores"),
    [
        ("250m", 250),
        # The API server writes "0.5" back as "500m"; a user may still send the decimal.
        ("0.5", 500),
        ("1", 1000),
        ("4", 4000),
        ("7800m", 7800),
        ("1.5", 1500),
        # Sub-millicore CPU is rounded up, as the API server rounds it.
        ("0.1m", 1),
        ("100u", 1),
        ("500000n", 1),
        ("1k", 1_000_000),
        ("1e3", 1_000_000),
        ("2E0", 2000),
        (" 2 ", 2000),
        # JSON numbers, which a hand-written object may carry instead of strings.
        (2, 2000),
        (0.25, 250),
    ],
)
def test_a_cpu_quantity_reads_as_millicores(raw: object, millicores: int) -> None:
    assert quantity.millicores(raw) == millicores


@pytest.mark.parametrize(
    ("raw", "size"),
    [
        ("64Mi", 64 * 2**20),
        ("1Gi", 2**30),
        ("0.5Gi", 2**29),
        ("1.5Ki", 1536),
        # What a kubelet writes as a node's allocatable memory.
        ("16283444Ki", 16283444 * 1024),
        ("32158316Ki", 32158316 * 1024),
        ("2G", 2_000_000_000),
        ("123M", 123_000_000),
        ("129e6", 129_000_000),
        ("128974848", 128974848),
        ("1Ti", 2**40),
        ("1Ei", 2**60),
        # A fraction of a byte rounds up.
        ("100m", 1),
    ],
)
def test_a_memory_quantity_reads_as_bytes(raw: object, size: int) -> None:
    assert quantity.bytes_of(raw) == size


@pytest.mark.parametrize(
    "raw",
    ["", "abc", "1.2.3", "10MiB", "Mi", "1 Gi", "0x10", "1e", "--1", None, True, [], {}],
)
def test_what_is_not_a_quantity_is_refused(raw: object) -> None:
    with pytest.raises(quantity.QuantityError):
        quantity.parse(raw)


@pytest.mark.parametrize("raw", [float("nan"), float("inf")])
def test_a_number_that_is_not_finite_is_refused(raw: float) -> None:
    with pytest.raises(quantity.QuantityError):
        quantity.millicores(raw)
