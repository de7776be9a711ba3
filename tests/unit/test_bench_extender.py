"""The extender bench sends what kube-scheduler sends: ExtenderArgs with Go's field names and
Node objects that score-nodes reads as it reads the real ones (usage fresh, allocatable
readable), with usage spread so that the filter fails some nodes and passes others."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from dev.bench.__main__ import main
from dev.bench.extender import SIZES, extender_args
from shared.nodes.score_nodes import decide as extender
from shared.nodes.score_nodes.handler import parse_args
from shared.platform.config import Config

NOW = datetime(2026, 11, 23, 18, 0, tzinfo=UTC)


@pytest.mark.parametrize("nodes", SIZES)
def test_the_request_is_read_as_the_schedulers_and_every_node_is_judged_on_its_usage(
    nodes: int,
) -> None:
    args = parse_args(extender_args(nodes, NOW))
    assert args.nodes is not None and len(args.nodes) == nodes
    assert args.names == tuple(f"node-{i}" for i in range(nodes))
    verdicts = extender.filter_nodes(args.pod, args.nodes, Config(), NOW).verdicts
    reasons = {v.reason for v in verdicts}
    # Nothing unknown: every node's record and allocatable were read.
    assert not reasons & extender.UNKNOWN_REASONS
    assert extender.FITS in reasons and extender.CPU_OVER in reasons
    scores = extender.prioritize(args.pod, args.nodes, Config(), NOW).scores
    assert {s.reason for s in scores} == {extender.SCORED}
    assert len({s.score for s in scores}) > 3


def test_the_extender_part_is_named_with_only(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--only", "extender", "--systems", "vanilla"])
    # Refused for --systems (a recovery option), after --only extender itself parsed.
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "--systems needs --only recovery" in error
    assert "invalid choice" not in error
