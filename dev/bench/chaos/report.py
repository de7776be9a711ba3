"""The figures of a chaos run, for people: a terminal summary and the table in
docs/reliability.md (between its ``chaos-figures`` markers, rewritten by ``make chaos``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final

from dev.bench.chaos.invariants import INVARIANTS
from dev.bench.common import ROOT

JSON = dict[str, Any]
START: Final = "<!-- chaos-figures:start (written by make chaos) -->"
END: Final = "<!-- chaos-figures:end -->"


def rows(r: JSON) -> list[tuple[str, str]]:
    f, e, m = r["faults"], r["events"], r["moves"]
    chaos = f["data_plane"]
    rec = r.get("recovery", {})
    by_invariant = r["invariants"]["violations_by_invariant"]
    checked = r["invariants"]["checked"]
    restarts = f["function_restarts"].get("update-annotations", 0)
    modes = ", ".join(sorted(set(r["faulty_nodes"].values())))
    return [
        (
            "storm",
            f"{r['storm']['pods']} failing pods ({_workloads(r)}), "
            f"{len(r['faulty_nodes'])} faulty nodes ({modes})",
        ),
        (
            "update-annotations SIGKILLed",
            f"{f['update_annotations_kills']} "
            f"({f['kills_on_state_write']} on a state write, {f['kills_at_random']} at random); "
            f"started again {restarts} times",
        ),
        (
            "kills between state write and delete",
            f"{f['kills_between_state_write_and_delete']} ({f['moves_cut_by_a_kill']} moves cut "
            "there)",
        ),
        (
            "moves removed by another delivery than the one that recorded them",
            str(m["finished_by_a_later_delivery"]),
        ),
        (
            "kube-apiserver / etcd restarts (SIGKILL)",
            f"{f['apiserver_restarts']} / {f['etcd_restarts']}"
            + (
                f"; {len(f['revived_after_a_restart'])} controllers restarted (lost their lease)"
                if f["revived_after_a_restart"]
                else ""
            ),
        ),
        (
            "data plane: source events lost / attempts dropped / answers lost",
            f"{chaos.get('ingress_dropped', 0)} / {chaos.get('attempts_dropped', 0)} / "
            f"{chaos.get('answers_lost', 0)}",
        ),
        (
            "data plane: duplicated / reordered",
            f"{chaos.get('duplicated', 0)} / {chaos.get('reordered', 0)}",
        ),
        (
            "events archived by the Broker (pod events, failing, of which from the sweep)",
            f"{e['routed']} ({e['pod_events']}, {e['failing']}, {e['failing_from_the_sweep']})",
        ),
        (
            "deliveries to the functions / Knative's retries / dead-lettered",
            f"{e['deliveries']} / {e['retries']} / {e['dead_lettered']}",
        ),
        ("moves recorded / Rescheduled Events", f"{m['recorded']} / {m['rescheduled_events']}"),
        ("every replica healthy after the faults", _seconds(rec.get("healthy_after_faults_s"))),
        *[
            (
                f"invariant `{name}`",
                f"{by_invariant.get(name, 0)} violations ({checked.get(name, 0)} "
                + ("dead letters)" if name == "dead-letters-permanent" else "checked)"),
            )
            for name in INVARIANTS
        ],
        ("invariant violations", str(r["violations"])),
    ]


def _workloads(r: JSON) -> str:
    w = r["storm"]["workloads"]
    parts = [f"{w.get(k, 0)} {k}s" for k in ("Deployment", "StatefulSet", "Job")]
    extra = r["storm"].get("extra_waves", 0)
    more = [f"{extra} extra waves"] if extra else []
    return ", ".join([*parts, f"{r['storm']['bare_pods']} bare pods", *more])


def _seconds(value: float | None) -> str:
    return "never (within the bound)" if value is None else f"{value:.0f} s"


def summary(r: JSON) -> str:
    width = max(len(k) for k, _ in rows(r))
    lines = [f"{k:<{width}}  {v}" for k, v in rows(r)]
    for v in r["invariants"]["violations"]:
        lines.append(f"VIOLATION {v['invariant']}: {v['subject']}: {v['message']}")
    return "\n".join(lines)


def table(r: JSON, json_path: Path) -> str:
    try:
        shown = json_path.resolve().relative_to(ROOT)
    except ValueError:
        shown = json_path
    head = [
        f"Run of {r['date'][:10]} (seed {r['seed']}, {r['machine']['cores']} cores, "
        f"{r['recovery']['runtime_s']:.0f} s in all), `{r['command']}`; every figure in "
        f"`{shown}`.",
        "",
        "| | |",
        "| --- | --- |",
    ]
    return "\n".join(head + [f"| {k} | {v} |" for k, v in rows(r)])


def write_doc(r: JSON, json_path: Path, doc: Path) -> None:
    text = doc.read_text() if doc.exists() else f"{START}\n{END}\n"
    if START not in text or END not in text:
        text += f"\n{START}\n{END}\n"
    block = f"{START}\n{table(r, json_path)}\n{END}"
    doc.write_text(
        re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _m: block, text, flags=re.S)
    )
