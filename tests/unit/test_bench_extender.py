"""The extender bench sends what kube-scheduler sends: ExtenderArgs with Go's field names and
Node objects that score-nodes reads as it reads the real ones (usage fresh, allocatable
readable), with usage spread so that the filter fails some nodes and passes others."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from dev.bench.__main__ import main
from dev.bench.extender import SIZES, cluster_node, extender_args, names_args, usage_record
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


def test_names_mode_sends_names_only_and_creates_nodes_the_api_server_accepts_as_new() -> None:
    args = parse_args(names_args(["bench-node-0", "bench-node-1"]))
    assert args.nodes is None and args.names == ("bench-node-0", "bench-node-1")
    node = cluster_node(7, usage_record(7, NOW))
    assert node["metadata"]["name"] == "bench-node-7"
    # What the API server sets, or refuses to take from a client on create.
    assert not {"uid", "resourceVersion", "creationTimestamp", "managedFields"} & set(
        node["metadata"]
    )
    # ... and the cache's view of it is judged on its usage.
    view = extender.view_of(node, Config())  # type: ignore[arg-type]
    assert isinstance(view.load, extender.Load) and view.score is not None
