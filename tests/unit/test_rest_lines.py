"""The harness client's watch reads one JSON object per line from chunks of any size."""

from __future__ import annotations

import pytest

from dev.localcluster.rest import lines


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        pytest.param([b'{"a":1}\n{"b":2}\n'], [b'{"a":1}', b'{"b":2}'], id="two lines in a chunk"),
        pytest.param([b'{"a"', b":1}\n"], [b'{"a":1}'], id="a line split across chunks"),
        pytest.param(
            [b'{"a":1}', b"\n", b'{"b"', b":2}"], [b'{"a":1}', b'{"b":2}'], id="no last newline"
        ),
        pytest.param([b"\n\n", b'{"a":1}\r\n', b"  \n"], [b'{"a":1}\r'], id="blank lines skipped"),
        pytest.param([], [], id="an empty watch"),
        pytest.param([b""] * 3, [], id="empty chunks"),
    ],
)
def test_a_watch_stream_splits_into_its_lines(chunks: list[bytes], expected: list[bytes]) -> None:
    assert list(lines(iter(chunks))) == expected
