"""The source-selector figures: medians and ratios from the rounds, and a RESULTS.md section that
a later run replaces and a full run's rewrite keeps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dev.bench import report, selector
from dev.bench.selector import SECTION_END, SECTION_START


def round_(changes: int, delivered: tuple[int, int], adapter: tuple[float, float]) -> Any:
    def mode(d: int, a: float) -> dict[str, Any]:
        return {
            "per_1000_pod_changes": {
                "delivered_to_detect_failures": 1000 * d / changes,
                "adapter_cpu_s": 1000 * a / changes,
                "detect_failures_cpu_s": 1000 * a / changes,
            },
            "delivered_to_detect_failures": d,
            "adapter_cpu_s": a,
            "detect_failures_cpu_s": a,
        }

    return {
        "pods": 200,
        "opted_in_pods": 20,
        "pod_changes": changes,
        "no_selector": mode(delivered[0], adapter[0]),
        "selector": mode(delivered[1], adapter[1]),
    }


ROUNDS = [
    round_(1000, (850, 85), (2.0, 0.2)),
    round_(1000, (860, 86), (3.0, 0.2)),
    round_(1000, (840, 84), (9.0, 0.3)),  # a noisy round moves the mean, not the median
]


def test_medians_per_thousand_pod_changes_and_their_ratio() -> None:
    m = selector.medians(ROUNDS)
    assert m["no_selector"]["delivered_to_detect_failures"] == 850
    assert m["selector"]["delivered_to_detect_failures"] == 85
    assert m["no_selector"]["adapter_cpu_s"] == 3.0
    assert m["ratio_no_selector_to_selector"]["delivered_to_detect_failures"] == 10.0
    assert m["ratio_no_selector_to_selector"]["adapter_cpu_s"] == 15.0
    assert m["opted_in_share"] == 0.1


def section(marker: str) -> str:
    result = {
        "nodes": 4,
        "deployments": 20,
        "replicas": 10,
        "opted_in_deployments": 2,
        "label_selector": "kn-rescheduler.io/opted-in=true",
        "rounds": ROUNDS,
        "medians_per_1000_pod_changes": selector.medians(ROUNDS),
    }
    return selector.render(result, f"{marker}.json", marker, "commit `0123456789ab`")


RESULTS = "# Benchmarks\n\n## 7. Cold start\n\n## Reading these numbers\n\ntext\n"


def test_the_section_goes_before_the_reading_notes_and_a_later_run_replaces_it() -> None:
    first = selector.place(section("run-1"), RESULTS)
    assert first.index(SECTION_START) < first.index("## Reading these numbers")
    assert "| events delivered to detect-failures | 850 | 85 | 10.0x |" in first
    second = selector.place(section("run-2"), first)
    assert "run-2.json" in second and "run-1.json" not in second
    assert second.count(SECTION_START) == second.count(SECTION_END) == 1
    assert second.replace(section("run-2"), "") == first.replace(section("run-1"), "")


def test_a_full_runs_rewrite_keeps_the_section(tmp_path: Path, monkeypatch: Any) -> None:
    target = tmp_path / "RESULTS.md"
    target.write_text(selector.place(section("run-1"), RESULTS))
    monkeypatch.setattr(report, "render", lambda results, path: "# Benchmarks, rewritten\n")
    report.write({}, tmp_path / "full.json", target)
    text = target.read_text()
    assert text.startswith("# Benchmarks, rewritten\n")
    assert section("run-1") in text
