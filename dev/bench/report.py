"""``dev/bench/RESULTS.md`` from one results file: the headline numbers, the peers side by side.

``python -m dev.bench.report dev/bench/results/<date>.json`` rewrites it from a saved run.
``python -m dev.bench.report --rows SYSTEM FILE ...`` prints one system's recovery row from each
file, in the columns of sections 1-3, for putting re-measurements beside the full run's.
``python -m dev.bench.report --compare FILE ...`` prints every system of every file's recovery run
in one table that names each run's scenario, kubelet back-off and nodes (kwok or real), with the
times from the first failure and from the threshold side by side (runs of either back-off,
scenario or kind of node compared).
``python -m dev.bench.report --scale FILE ...`` prints the scale run's recovery row of each file.
``python -m dev.bench.report --functions FILE`` prints its figures function by function.
``python -m dev.bench.report --load FILE`` prints the load-aware section (9) of a run that measured
it (``--only load``), to put into RESULTS.md beside the full run's sections.
``python -m dev.bench.report --throughput FILE`` prints the scheduling-throughput table of a run
that measured it (``--only throughput``): pods/s with and without the extender.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from dev.bench import selector
from dev.bench.common import JSON, ROOT
from dev.bench.loadaware import SYSTEMS as LOAD_SYSTEMS

TARGET_RECOVERY_FROM_THRESHOLD_S = 5.0
TARGET_DETECT_EVENTS_PER_S = 10_000.0
TARGET_DETECT_VS_FLOOR = 2.0
TARGET_WEBHOOK_P99_MS = 10.0


def _f(value: Any, digits: int = 1, unit: str = "") -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        text = f"{value:,.{digits}f}"
    else:
        text = f"{value:,}" if isinstance(value, int) else str(value)
    return text + unit


def _met(ok: bool | None) -> str:
    return "n/a" if ok is None else ("**met**" if ok else "**not met**")


def render(results: JSON, results_path: Path) -> str:
    m = results["measurements"]
    mach = results["machine"]
    sc = results["scales"]
    rel = results_path.relative_to(ROOT) if results_path.is_relative_to(ROOT) else results_path
    lines = [
        "# Benchmarks: kn-rescheduler and its peers",
        "",
        f"One `make bench` run, {results['date']}, every number below from that run "
        f"(raw: [`{rel.name}`](results/{rel.name})); the systems ran one after the other on the "
        "same local control plane. Harness: `dev/bench/` (`python -m dev.bench`); how each "
        "number is made is in the docstring of its module." + _code(results),
        "",
        f"Machine: {mach['cores']} cores ({mach['cpu_model']}), {mach['memory_gib']} GiB, "
        f"shared with other engineers' test runs (load average at start "
        f"{', '.join(f'{x:.1f}' for x in mach['load_average_at_start'])}); Python "
        f"{mach['python']}, Go {mach['go']}, Kubernetes {mach['kubernetes']} (etcd, "
        "kube-apiserver, kube-controller-manager, kube-scheduler built from their modules; kwok "
        "nodes; the project's fake kubelet). "
        f"`make bench` took {results['runtime_s'] / 60:.1f} min.",
        "",
    ]
    targets: list[tuple[str, str, str]] = []
    rec = m.get("recovery")
    if rec:
        systems = rec["systems"]
        kn = systems.get("kn-rescheduler", {})
        lines += [
            "## 1-3. Time to recovery, moves, API cost",
            "",
            f"{sc['nodes']} nodes, {sc['faulty']} crash-looping every pod bound to them; "
            f"{sc['deployments']} Deployments x {sc['replicas']} replicas, each preferring one "
            'faulty node, `scheduling-retries: "3"`. Recovery: from a replica\'s first failure '
            "to a replacement Ready on a healthy node; each system got "
            f"{sc['recovery_bound']:.0f} s from the creation of the workloads. "
            f"Descheduler {rec['descheduler_version']} (the brief's v0.34.0 is not served by the "
            "Go module proxy here), `RemovePodsHavingTooManyRestarts` (threshold 3, "
            "CrashLoopBackOff) + `RemoveFailedPods`, DefaultEvictor defaults (nodeFit off).",
            "",
            "| system | recovered (≤5 min) | p50 from failure | p95 from failure | p95 from "
            "threshold | moves / recovery | wasted moves | own API requests / move | all API "
            "requests / s |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for name, r in sorted(systems.items(), key=lambda item: _system_order(item[0])):
            lines.append(f"| {name} | {recovery_cells(r)} |")
        lines += [
            "",
            "![CDF of the time to recovery](results/" + rel.stem + "-recovery-cdf.png)",
            "",
        ]
        h = rec.get("healthy_updates") or {}
        if h:
            lines += [
                f"Healthy pod updates with the pipeline running: {h['updates']} annotation "
                f"patches of {sc['healthy_pods']} opted-in Ready pods, "
                f"{h['update_events_routed']} update events routed to detect-failures, "
                f"{h['replies_routed']} replies; API requests by the pipeline: "
                f"**{_f(h['pipeline_requests_per_1000_updates'], 1)} per 1,000 updates**; all "
                "API requests beyond the driver's own (controllers, leases, kwok included): "
                f"{_f(h['all_requests_beyond_driver_per_1000_updates'], 0)} per 1,000.",
                "",
            ]
            targets.append(
                (
                    "zero API requests per healthy pod event",
                    _met(h["pipeline_requests"] == 0),
                    f"{_f(h['pipeline_requests'], 0)} requests for {h['updates']} updates",
                )
            )
        if kn:
            p95 = kn["recovery_from_threshold"]["p95"]
            targets.append(
                (
                    "time to recovery p95 within 5 s of the restart threshold",
                    _met(p95 is not None and p95 <= TARGET_RECOVERY_FROM_THRESHOLD_S),
                    f"p95 {_f(p95, 1, ' s')} "
                    f"(p50 {_f(kn['recovery_from_threshold']['p50'], 1, ' s')}); replicas moved "
                    "once: p95 "
                    f"{_f((kn.get('recovery_from_threshold_one_move') or {}).get('p95'), 1, ' s')}",
                )
            )
            targets.append(
                (
                    "exactly one move per recovery when healthy nodes exist",
                    _met(kn["moves_per_recovery"] == 1.0),
                    f"{_f(kn['moves_per_recovery'], 2)} moves per recovery, "
                    f"{kn['wasted_moves']} of {kn['moves_total']} moves "
                    "landed on another faulty node",
                )
            )
    det = m.get("detect")
    if det:
        ip, ht = det["in_process"], det["http"]
        lines += [
            "## 4. detect-failures throughput",
            "",
            f"Corpus: {det['corpus']['distinct_events']} real ApiServerSource pod events "
            f"(`{det['corpus']['file']}`), {_f(ip['failing_share'] * 100, 1)}% failing, "
            f"{ip['mean_body_bytes']:,} bytes on average, cycled to {ip['events']:,} events.",
            "",
            "| path | events/s | vs. JSON floor |",
            "| --- | --- | --- |",
            f"| `json.loads` of the body only (floor), one core | "
            f"{_f(ip['json_floor']['events_per_s'], 0)} | 1.00 |",
            f"| `events.parse` + `detect`, in-process, one core | "
            f"{_f(ip['parse_and_detect']['events_per_s'], 0)} | "
            f"{_f(ip['cost_vs_floor'], 2)}x the time |",
            "| `detect` on a parsed event, one core | "
            f"{_f(ip['detect_only']['events_per_s'], 0)} | |",
            f"| HTTP, gunicorn (image command, log level INFO), {ht['concurrency']} keep-alive "
            f"clients on loopback | {_f(ht['events_per_s'], 0)} (p50 "
            f"{_f(ht['latency_ms']['p50'], 1)} ms, p99 {_f(ht['latency_ms']['p99'], 1)} ms) | |",
            f"| same, per CPU-second of the server process | "
            f"{_f(ht['events_per_server_cpu_s'], 0)} | |",
        ]
        if det.get("http_quiet"):
            hq = det["http_quiet"]
            lines.append(
                "| HTTP, log level WARNING (no per-event log line) | "
                f"{_f(hq['events_per_s'], 0)} (p99 {_f(hq['latency_ms']['p99'], 1)} ms); "
                f"{_f(hq['events_per_server_cpu_s'], 0)} per server CPU-second | |"
            )
        lines.append("")
        rate = ip["parse_and_detect"]["events_per_s"]
        targets.append(
            (
                "detect-failures ≥ 10,000 pod events/s per core in-process",
                _met(rate >= TARGET_DETECT_EVENTS_PER_S),
                f"{_f(rate, 0)} events/s",
            )
        )
        targets.append(
            (
                "detect-failures ≤ 2x the JSON-parse floor",
                _met((ip["cost_vs_floor"] or 99) <= TARGET_DETECT_VS_FLOOR),
                f"{_f(ip['cost_vs_floor'], 2)}x",
            )
        )
    wh = m.get("webhook")
    if wh:
        pc = wh["pod_creation"]
        lines += [
            "## 5. Webhook",
            "",
            "| path | p50 | p99 |",
            "| --- | --- | --- |",
            f"| `Admitter.review` in-process, owner lookups against the API server | "
            f"{_f(wh['in_process']['latency_ms']['p50'], 2, ' ms')} | "
            f"{_f(wh['in_process']['latency_ms']['p99'], 2, ' ms')} |",
            "| mutate-admission over TLS (gunicorn) | "
            f"{_f(wh['tls']['latency_ms']['p50'], 2, ' ms')} | "
            f"{_f(wh['tls']['latency_ms']['p99'], 2, ' ms')} |",
            f"| pod create through the API server, no webhook ({pc['rate_per_s']:.0f}/s) | "
            f"{_f(pc['without_webhook_ms']['p50'], 2, ' ms')} | "
            f"{_f(pc['without_webhook_ms']['p99'], 2, ' ms')} |",
            f"| pod create through the API server, webhook registered | "
            f"{_f(pc['with_webhook_ms']['p50'], 2, ' ms')} | "
            f"{_f(pc['with_webhook_ms']['p99'], 2, ' ms')} |",
            f"| ratio with / without | {_f(pc['p50_ratio'], 2)}x | {_f(pc['p99_ratio'], 2)}x |",
            "",
        ]
        p99 = wh["in_process"]["latency_ms"]["p99"]
        targets.append(
            (
                "webhook p99 < 10 ms with lookups",
                _met(p99 is not None and p99 < TARGET_WEBHOOK_P99_MS),
                f"in-process p99 {_f(p99, 2, ' ms')}; over TLS p99 "
                f"{_f(wh['tls']['latency_ms']['p99'], 2, ' ms')}",
            )
        )
    scl = m.get("scale")
    if scl:
        ro = scl["rollout"]
        lines += ["## 6. Scale", ""]
        lines.append(
            "The brief asks for 1,000 nodes and 10,000 pods. The rollout runs at about "
            f"{ro['expected'] / max(ro['seconds'], 1):.0f} pods/s here, so the largest size "
            "that fits in about ten minutes is what ran: "
        )
        lines.append(
            f"{scl['nodes']:,} kwok nodes, {scl['pods']:,} pods "
            f"({scl['deployments']:,} Deployments x {scl['replicas_per_deployment']}), "
            "the whole pipeline running. Rollout: "
            f"{ro['ready']:,}/{ro['expected']:,} Ready in {ro['seconds']:.0f} s; function CPU "
            f"during it: {_cpu(ro['function_cpu_s'])}; the control plane: "
            f"{_cpu(ro.get('control_plane_cpu_s', {}))}; the harness process alone (fake "
            f"kubelet, tracker, the tests' event archive) "
            f"{_f(ro.get('harness_process_cpu_s'), 0, ' CPU-s')}."
        )
        r = scl.get("recovery") or {}
        if "affected_replicas" in r:
            lines += ["", *SCALE_HEADER, scale_row(scl)]
            targets.append(
                (
                    f"exactly one move per recovery at scale ({scl['nodes']} nodes, "
                    f"{scl['faulty_nodes']} faulty)",
                    _met(r["moves_per_recovery"] == 1.0),
                    f"{_f(r['moves_per_recovery'], 2)} moves per recovery, "
                    f"{r['wasted_moves']} of {r['moves']} moves landed on another faulty node",
                )
            )
            lines += [
                "",
                f"Then {scl['faulty_nodes']} nodes ({sc['scale_faulty_share'] * 100:.0f}%) turned "
                f"faulty at once ({_fault_hit(r)}, see `dev/bench/scale.py`): "
                f"{r['recovered']}/{r['affected_replicas']} "
                f"affected replicas recovered, **all on healthy nodes after "
                f"{_f(r['time_to_all_healthy_s'], 1, ' s')}**; p95 from failure "
                f"{_f(r['recovery_from_failure']['p95'], 1, ' s')}, from threshold "
                f"{_f(r['recovery_from_threshold']['p95'], 1, ' s')}; {r['moves']} moves "
                f"({r['wasted_moves']} wasted); function CPU: {_cpu(r['function_cpu_s'])}.",
            ]
        elif r:
            lines += ["", f"Recovery phase: {r.get('skipped')}."]
        lines.append("")
    cold = m.get("cold-start")
    if cold:
        lines += [
            "## 7. Cold start (process start to first answered event)",
            "",
            "| function | median |",
            "| --- | --- |",
        ]
        for name, c in cold.items():
            lines.append(f"| {name} | {_f(c['median_s'], 2, ' s')} |")
        lines.append("")
    load = m.get("load")
    if load:
        lines += load_section(load)
    if targets:
        lines += ["## Targets", "", "| target | result | measured |", "| --- | --- | --- |"]
        lines += [f"| {t} | {ok} | {how} |" for t, ok, how in targets]
        lines.append("")
    if results.get("errors"):
        lines += ["## Errors in this run", ""]
        lines += [f"- {k}: {v}" for k, v in results["errors"].items()]
        lines.append("")
    return "\n".join(lines)


LOAD_HEADER = [
    "| system | rebalancer | placed: max CPU | std dev | nodes > 80 % | evictions | every node "
    "< 80 % after | end: max CPU | std dev | nodes > 80 % | held |",
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
]


def load_section(load: JSON) -> list[str]:
    """Section 9: ``bench.loadaware``'s systems side by side (``LOAD_HEADER``)."""
    sc = load["scales"]
    base = [cpu * 100 for cpu, _ in load["background"].values()]
    low, high = min(base), max(base)
    shapes = ", ".join(
        f"{s['name']} x{s['replicas']} ({s['cpu_request']} requested, {s['cpu_usage']:g} used)"
        for s in load["shapes"]
    )
    lines = [
        "## 9. Load-aware placement and rebalancing (`dev/bench/loadaware.py`)",
        "",
        f"{load['nodes']} nodes of 8 CPUs, background CPU usage {low:.0f}-{high:.0f} %; a burst of "
        f"{load['pods']} pods in {len(load['shapes'])} Deployments created at once, each pod "
        f"using what its annotation says, not what it requests: {shapes} (cores). Node usage "
        "is simulated from the pods running on each node, in percent of the machine, and read "
        f"by everything through the local Prometheus (rate window {sc['rate_window']}). A "
        f"rebalancer got up to {sc['rebalance_bound_s']:.0f} s (ended sooner once every node "
        f"stayed under 80 % for {sc['hold_s']:.0f} s); rebalance-nodes and the descheduler "
        f"ran every {sc['rebalance_every_s']} s, annotate-usage every "
        f"{sc['usage_every_s']:g} s. Descheduler {load['descheduler_version']}: "
        "`LowNodeUtilization` on a Prometheus query (`MetricResource` under "
        '40 % / over 80 %). "after" is from the start of rebalancing; — is never within the '
        "bound; held: still every node under 80 % at the end.",
        "",
        *LOAD_HEADER,
    ]
    systems = load["systems"]
    order = [n for n in LOAD_SYSTEMS if n in systems] + sorted(set(systems) - set(LOAD_SYSTEMS))
    for name in order:
        r = systems[name]
        placed, end = r["after_placement"], r["end"]
        cells = [
            name,
            r["rebalancer"] or "none",
            _f(placed["max_cpu_percent"], 1, " %"),
            _f(placed["stdev_cpu_percent"], 1),
            _f(placed["nodes_over_threshold"]),
            _f(r["evictions"]),
            _f(r["all_under_threshold_s"], 1, " s"),
            _f(end["max_cpu_percent"], 1, " %"),
            _f(end["stdev_cpu_percent"], 1),
            _f(end["nodes_over_threshold"]),
            "yes" if r["held_to_end"] else "no",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    failed = (systems.get("descheduler") or {}).get("descheduler_cycles") or {}
    if failed.get("failed"):
        lines += [
            "",
            f"The descheduler failed to read Prometheus in {failed['failed']} of its "
            f"{failed['run']} cycles (it evicts nothing in such a cycle).",
        ]
    for name, why in (load.get("failures") or {}).items():
        lines += ["", f"{name}: not measured ({why})."]
    pending = {n: systems[n]["pending_after_placement"] for n in order}
    if any(pending.values()):
        lines += [
            "",
            "Pods no node took within the placement bound: "
            + ", ".join(f"{n} {p}" for n, p in pending.items() if p)
            + ".",
        ]
    lines.append("")
    return lines


# bench.throughput's systems, in the header's order: the extender's column beside its baseline.
THROUGHPUT_COLUMNS = ("default", "second-no-extender", "extender", "extender-objects")
THROUGHPUT_HEADER = [
    "| clientConnection (qps / burst) | default scheduler | second, no extender "
    "| second + score-nodes (names, node cache) | second + score-nodes (whole Nodes) "
    "| names / second | whole Nodes / second | names / default |",
    "|---|---|---|---|---|---|---|---|",
]


def throughput_section(measured: JSON) -> list[str]:
    """``bench.throughput``'s median pods/s per scheduler and client setting, and the ratios."""
    lines = [
        f"Scheduling throughput (`dev/bench/throughput.py`): {measured['nodes']} nodes, batches of "
        f"{measured['pods_per_round']} bare pods created at once, median pods/s from the first "
        f"create until all are bound over {measured['rounds']} rounds (after "
        f"{measured['warmup_rounds']} not counted); the same clientConnection for the "
        "schedulers in a row.",
        "",
        *THROUGHPUT_HEADER,
    ]
    for name, setting in measured["settings"].items():
        client = setting["client_connection"]
        cells = [
            f"{name} ({client['qps']} / {client['burst']})",
            *(_f((setting.get(s) or {}).get("median_pods_per_s"), 1) for s in THROUGHPUT_COLUMNS),
            _f(setting["ratio_extender_to_second_no_extender"], 2),
            _f(setting.get("ratio_extender_objects_to_second_no_extender"), 2),
            _f(setting["ratio_extender_to_default"], 2),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def recovery_cells(r: JSON) -> str:
    """One system's cells of the sections 1-3 table, from recovered to all API requests/s."""
    return (
        f"{r['recovered']}/{r['affected']} "
        f"({_f((r['recovered_within_5min_share'] or 0) * 100, 0)}%) | "
        f"{_f(r['recovery_from_failure']['p50'], 1, ' s')} | "
        f"{_f(r['recovery_from_failure']['p95'], 1, ' s')} | "
        f"{_f(r['recovery_from_threshold']['p95'], 1, ' s')} | "
        f"{_f(r['moves_per_recovery'], 2)} | {r['wasted_moves']} of {r['moves_total']} | "
        f"{_f(r['api']['system_requests_per_move'], 1)} | "
        f"{_f(r['api']['all_requests_per_s'], 1)}"
    )


SCALE_HEADER = [
    "| nodes | faulty | affected replicas | recovered | moves | wasted moves (landed on another "
    "faulty node) | moves / recovery | replicas moved more than once | all healthy after | p95 "
    "from failure | p95 from threshold |",
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
]


def scale_row(scl: JSON, first: str = "") -> str:
    """The scale run's recovery as one row of ``SCALE_HEADER`` (``first``: a leading cell)."""
    r = scl["recovery"]
    moved_again = r.get("replicas_moved_more_than_once")
    cells = [
        f"{scl['nodes']:,}",
        f"{scl['faulty_nodes']}",
        f"{r['affected_replicas']}",
        f"{r['recovered']}",
        f"{r['moves']}",
        f"**{r['wasted_moves']}** ({_f(r['wasted_moves'] * 100 / r['moves'], 0)}%)"
        if r["moves"]
        else "0",
        _f(r["moves_per_recovery"], 2),
        _f(moved_again),
        _f(r["time_to_all_healthy_s"], 1, " s"),
        _f(r["recovery_from_failure"]["p95"], 1, " s"),
        _f(r["recovery_from_threshold"]["p95"], 1, " s"),
    ]
    return "| " + " | ".join(([first] if first else []) + cells) + " |"


def scale_rows(paths: list[Path]) -> list[str]:
    """Each file's scale recovery row, led by its date, commit, file and kubelet back-off."""
    out = [
        "| run (UTC), commit, raw, kubelet back-off " + SCALE_HEADER[0],
        "| --- " + SCALE_HEADER[1],
    ]
    for path in paths:
        results = json.loads(path.read_text())
        scl = results["measurements"]["scale"]
        if "affected_replicas" not in (scl.get("recovery") or {}):
            continue
        out.append(scale_row(scl, f"{_run_cell(results, path)}, {_backoff(results)}"))
    return out


FUNCTIONS_HEADER = [
    "| function | phase | CPU s | API requests | API p50 / p99 (≤) | handled | handled/s "
    "| handler mean | handler p99 (≤) |",
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
]


def _bound(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return f"{seconds * 1000:g} ms" if seconds < 1 else f"{seconds:g} s"


def functions_rows(scl: JSON) -> list[str]:
    """The scale run function by function, each phase a row: its CPU, its API requests as the
    API server timed them, the events it handled as it timed them (a timer-driven function's
    mean is its time per tick). Runs from before the per-function figures have none."""
    out = list(FUNCTIONS_HEADER)
    phases = [(name, (scl.get(name) or {}).get("functions")) for name in ("rollout", "recovery")]
    names = sorted({f for _, functions in phases for f in functions or {}})
    for function in names:
        for phase, functions in phases:
            f = (functions or {}).get(function)
            if f is None:
                continue
            api = f["api"]
            latency = (
                f"{_bound(api['p50_s_at_most'])} / {_bound(api['p99_s_at_most'])}"
                if api["requests"]
                else "—"
            )
            mean = f["handler_mean_s"]
            cells = [
                function,
                phase,
                _f(f["cpu_s"]),
                f"{api['requests']:,}",
                latency,
                f"{f['handled']:,}",
                # The first run with these figures counted CloudEvents a second only.
                _f(f.get("handled_per_s")),
                _f(mean * 1000, 0, " ms") if mean is not None and mean < 1 else _f(mean, 2, " s"),
                _bound(f["handler_p99_s_at_most"]),
            ]
            out.append("| " + " | ".join(cells) + " |")
    return out


COMPARE_HEADER = [
    "| run (UTC), commit, raw | scenario | kubelet back-off | nodes | system | recovered (≤5 min) "
    "| first failure to threshold p50 | p50 from failure | p95 from failure | p50 from threshold "
    "| p95 from threshold | moves / recovery | wasted moves |",
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
]


def compare(paths: list[Path]) -> list[str]:
    """Every system of each file's recovery run, one row each, naming the run's scenario,
    back-off and nodes (files from before any of them existed are the committed scenario,
    compressed clock, kwok nodes)."""
    out = list(COMPARE_HEADER)
    for path in paths:
        results = json.loads(path.read_text())
        rec = results["measurements"]["recovery"]
        scenario = rec.get("scenario", "prefer-faulty")
        backoff = rec.get("kubelet_backoff", "compressed")
        for name, r in sorted(rec["systems"].items(), key=lambda item: _system_order(item[0])):
            share = _f((r["recovered_within_5min_share"] or 0) * 100, 0)
            cells = [
                _run_cell(results, path),
                scenario,
                backoff,
                nodes_cell(results),
                name,
                f"{r['recovered']}/{r['affected']} ({share}%)",
                _f((r.get("threshold_from_failure") or {}).get("p50"), 1, " s"),
                _f(r["recovery_from_failure"]["p50"], 1, " s"),
                _f(r["recovery_from_failure"]["p95"], 1, " s"),
                _f(r["recovery_from_threshold"]["p50"], 1, " s"),
                _f(r["recovery_from_threshold"]["p95"], 1, " s"),
                _f(r["moves_per_recovery"], 2),
                f"{r['wasted_moves']} of {r['moves_total']}",
            ]
            out.append("| " + " | ".join(cells) + " |")
    return out


def nodes_cell(results: JSON) -> str:
    """The nodes a recovery run measured on: how many, which kind, how many faulty, e.g.
    "20 kwok nodes, 4 faulty" or "3 real nodes, 1 faulty" (files from before real nodes: kwok)."""
    rec = results["measurements"]["recovery"]
    kind = rec.get("nodes", "kwok")
    count = rec.get("node_count", results["scales"]["nodes"])
    return f"{count} {kind} nodes, {len(rec.get('faulty_nodes') or [])} faulty"


def _run_cell(results: JSON, path: Path) -> str:
    commit = (results.get("code") or {}).get("commit") or ""
    return (
        f"{results['date'][:16].replace('T', ' ')}, `{commit[:12]}`, "
        f"[`{path.name}`](results/{path.name})"
    )


def _backoff(results: JSON) -> str:
    return str(results.get("kubelet_backoff", "compressed"))


def rows(system: str, paths: list[Path]) -> list[str]:
    """``system``'s row from each results file: its date, commit and file, then its cells."""
    out = []
    for path in paths:
        results = json.loads(path.read_text())
        r = results["measurements"]["recovery"]["systems"][system]
        out.append(f"| {_run_cell(results, path)} | {recovery_cells(r)} |")
    return out


def _system_order(name: str) -> tuple[int, int]:
    """vanilla, the descheduler from its slowest cadence to its fastest, kn-rescheduler."""
    if name == "vanilla":
        return (0, 0)
    if name.startswith("descheduler-"):
        interval = name.removeprefix("descheduler-")
        seconds = int(interval[:-1]) * (60 if interval.endswith("m") else 1)
        return (1, -seconds)
    return (2, 0)


def _code(results: JSON) -> str:
    code = results.get("code") or {}
    if not code.get("commit"):
        return ""
    text = f" Code: commit `{code['commit'][:12]}`"
    if code.get("local_changes"):
        text += f" with local changes to {len(code['local_changes'])} file(s)"
    return text + "."


def _cpu(values: dict[str, float]) -> str:
    total = sum(values.values())
    parts = ", ".join(f"{k} {v:.1f}" for k, v in values.items())
    return f"{total:.1f} CPU-s ({parts})"


def write(results: JSON, results_path: Path, target: Path, notes: str = "") -> None:
    text = render(results, results_path)
    notes_file = ROOT / "dev" / "bench" / "NOTES.md"
    if notes_file.exists():
        text += "\n" + notes_file.read_text()
    text += notes
    # The source-selector section comes from its own run (--only source-selector): kept.
    kept = selector.kept_section(target.read_text()) if target.exists() else None
    if kept is not None:
        text = selector.place(kept, text)
    target.write_text(text)


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if args[:1] == ["--rows"]:
        print("\n".join(rows(args[1], [Path(a) for a in args[2:]])))
        return 0
    if args[:1] == ["--compare"]:
        print("\n".join(compare([Path(a) for a in args[1:]])))
        return 0
    if args[:1] == ["--scale"]:
        print("\n".join(scale_rows([Path(a) for a in args[1:]])))
        return 0
    if args[:1] == ["--functions"]:
        results = json.loads(Path(args[1]).read_text())
        print("\n".join(functions_rows(results["measurements"]["scale"])))
        return 0
    if args[:1] == ["--load"]:
        results = json.loads(Path(args[1]).read_text())
        print("\n".join(load_section(results["measurements"]["load"])))
        return 0
    if args[:1] == ["--throughput"]:
        results = json.loads(Path(args[1]).read_text())
        print("\n".join(throughput_section(results["measurements"]["throughput"])))
        return 0
    path = Path(args[0]).resolve()
    write(json.loads(path.read_text()), path, ROOT / "dev" / "bench" / "RESULTS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())


def _fault_hit(r: JSON) -> str:
    """How the fault reached the pods: in place (now), or by the harness deleting them (the
    runs before faults hit running containers; their faulty nodes were emptied first)."""
    if "pods_hit_in_place" in r:
        return f"{r['pods_hit_in_place']} pods running on them crashed in place"
    return f"{r['pods_restarted_by_fault']} pods on them deleted and restarted by the harness"
