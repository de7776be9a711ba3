"""The command line: ``kubectl kn-rescheduler <command>``, or ``kn rescheduler <command>``.

kubectl runs a plugin with the arguments after its name and nothing else (no ``--context`` of
its own reaches the plugin), so the plugin takes kubectl's connection flags itself:
``--kubeconfig``, ``--context`` and ``-n/--namespace``, defaulting as kubectl does (the
context's namespace, else ``default``).

Exit status: 0 done; 1 the API server refused or failed a read (said in one sentence); 2 a
command line or an object name the plugin cannot act on.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, TextIO

from kubectl_kn_rescheduler import archive, cleanup, explain, nodes, recorded, replay, status
from kubectl_kn_rescheduler.reading import UsageError, installed_settings, parse_target
from shared.api.keys import DEFAULT_NAMESPACE
from shared.platform import kube

OK = 0
FAILED = 1
USAGE = 2
# Seconds each request may take: a server that accepts and never answers is said at once.
TIMEOUT: Final = 10.0

EPILOG = """commands:
  status TYPE/NAME   a workload's moves, budget, excluded nodes, stop, pods and Events
  explain POD        what kn-rescheduler will do about a pod and why, by the functions' code
  nodes [NODE...]    every mark of ours on Nodes: why, since when, until when
  cleanup            list every mark of ours; --yes removes them (after an uninstall)
  replay [FILE]      the functions' logged events through their own code again, every
                     write a server-side dry run (FILE: an archive; default: the logs)

Read-only unless asked: only `cleanup --yes` writes; `explain` and `replay` send the writes
they would make as server-side dry runs (validated by the API server, never stored).
Docs: docs/plugin.md"""


def _connection_flags(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """kubectl's flags, taken before or after the command (``status deploy/web -n shop``).

    On the commands they default to SUPPRESS, so a flag given before the command is kept.
    """

    def default(value: str | None) -> str | None:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--kubeconfig",
        default=default(None),
        help="the kubeconfig file (default: $KUBECONFIG, ~/.kube/config)",
    )
    parser.add_argument(
        "--context", default=default(None), help="the kubeconfig context (default: its current)"
    )
    parser.add_argument(
        "-n",
        "--namespace",
        default=default(None),
        help="the namespace (default: the context's, or default)",
    )
    parser.add_argument(
        "--installed-in",
        default=default(DEFAULT_NAMESPACE),
        help=f"where kn-rescheduler runs, to read its settings (default: {DEFAULT_NAMESPACE})",
    )
    parser.add_argument(
        "-o", "--output", choices=("text", "json"), default=default("text"), help="text or json"
    )


def parser(program: str = "kubectl kn-rescheduler") -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog=program,
        description="What kn-rescheduler did and will do, read from the cluster.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _connection_flags(top, defaults=True)
    flags = argparse.ArgumentParser(add_help=False)
    _connection_flags(flags, defaults=False)
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=text, description=text, parents=[flags])

    one = command("status", "a workload's moves, budget, exclusions, pods and Events")
    one.add_argument("workload", help="TYPE/NAME: deployment/web, statefulset/db, job/x, pod/y")
    why = command("explain", "what kn-rescheduler will do about a pod, and why")
    why.add_argument("pod", help="NAME or pod/NAME")
    marks = command("nodes", "every mark of ours on Nodes: why, since when, until when")
    marks.add_argument("names", nargs="*", help="only these Nodes (default: every marked one)")
    marks.add_argument("--all", action="store_true", help="also list Nodes without a mark")
    clean = command("cleanup", "list every mark of ours; --yes removes them")
    clean.add_argument("--yes", action="store_true", help="remove them (default: only list)")
    clean.add_argument(
        "--dry-run",
        choices=("server",),
        help="send the removals with dryRun=All: the API server validates them, stores nothing",
    )
    clean.add_argument(
        "--pressure-label",
        metavar="KEY=VALUE",
        help="label-nodes' label (default: KN_RESCHEDULER_PRESSURE_LABEL as installed, else "
        f"{cleanup.PRESSURE_LABEL}); the key with another value is someone else's and stays",
    )
    again = command(
        "replay", "the functions' logged events through their own code, writes as dry runs"
    )
    again.add_argument(
        "file",
        nargs="?",
        help="an archive or log lines to replay (default: the installed functions' logs)",
    )
    again.add_argument("--save", metavar="FILE", help="also write the logs' archive to FILE")
    again.add_argument("--type", action="append", default=[], help="only this event type")
    again.add_argument("--subject", action="append", default=[], help="subject contains this")
    again.add_argument("--id", action="append", default=[], help="only this event id")
    return top


def run() -> int:
    """The executables' entry point: ``main`` with the functions' log lines kept quiet (their
    modules log as services do; here a failure is said once, in a sentence)."""
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    return main()


def main(
    argv: Sequence[str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    now: datetime | None = None,
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    args = parser(_program()).parse_args(argv)
    try:
        # One attempt, no client retries: a person is waiting, and says when to try again.
        api = kube.Kube.from_environment(
            kubeconfig=args.kubeconfig,
            context=args.context,
            timeout=TIMEOUT,
            attempts=1,
            client_retries=0,
        )
    except Exception as exc:  # the client's reader raises its own, YAML, OS and type errors
        print(f"kubectl-kn_rescheduler: cannot use the kubeconfig: {_first(exc)}", file=err)
        return FAILED
    namespace = (
        args.namespace or kube.Kube.context_namespace(args.kubeconfig, args.context) or "default"
    )
    moment = now or datetime.now(UTC)
    try:
        return _run(args, api, namespace, moment, out, err)
    except UsageError as exc:
        print(f"kubectl-kn_rescheduler: {exc}", file=err)
        return USAGE
    except kube.KubeError as exc:
        print(f"kubectl-kn_rescheduler: the API server: {_first(exc)}", file=err)
        return FAILED


def _first(exc: BaseException) -> str:
    """The first line of what ``exc`` says, shown safe."""
    text = str(exc).strip()
    return shown(text.splitlines()[0] if text else type(exc).__name__)


def _program() -> str:
    """How the user called it: ``kn rescheduler`` through kn, else ``kubectl kn-rescheduler``."""
    called = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return "kn rescheduler" if called == "kn-rescheduler" else "kubectl kn-rescheduler"


# Control characters (C0 but tab, DEL, C1) and the invisible ones that reorder or hide text
# (zero-width, bidirectional overrides and isolates): names, reasons and Event messages are
# written by anyone who can write a workload or an Event, and a terminal obeys them.
_CONTROL: Final = re.compile(
    "[\x00-\x08\x0a-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]"
)
# A line longer than this is cut (a refused record's reason quotes the value it refused).
MAX_LINE: Final = 2000


def shown(line: str) -> str:
    """``line`` safe for a terminal: each control or invisible character as its escape, and at
    most MAX_LINE characters."""
    if len(line) > MAX_LINE:
        line = line[:MAX_LINE] + f"... ({len(line) - MAX_LINE} more characters; -o json has all)"

    def escaped(match: re.Match[str]) -> str:
        code = ord(match.group())
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"

    return _CONTROL.sub(escaped, line)


def _emit(out: TextIO, as_json: bool, data: object, lines: Sequence[str]) -> None:
    if as_json:
        # JSON escapes every control character itself.
        out.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    else:
        out.write("\n".join(shown(line) for line in lines) + "\n")


def _run(
    args: argparse.Namespace,
    api: kube.Kube,
    namespace: str,
    now: datetime,
    out: TextIO,
    err: TextIO,
) -> int:
    as_json = args.output == "json"
    if args.command == "status":
        kind, name = parse_target(args.workload)
        settings = installed_settings(api, args.installed_in)
        found = status.gather(api, kind, namespace, name, settings.cfg)
        _emit(out, as_json, status.as_json(found), status.render(found, now))
        return OK
    if args.command == "explain":
        kind, name = parse_target(args.pod, default_kind="pod")
        if kind != "Pod":
            raise UsageError(f"explain takes a pod, got {args.pod!r}: try status {args.pod}")
        settings = installed_settings(api, args.installed_in)
        said = explain.explain(
            api, settings.cfg, settings.source, namespace, name, clock=lambda: now
        )
        _emit(out, as_json, said.as_json(), explain.render(said))
        return OK
    if args.command == "nodes":
        settings = installed_settings(api, args.installed_in)
        wanted = set(args.names)
        listed = [
            nodes.node_marks(node, now, settings.cfg)
            for node in api.list_all("Node")
            if not wanted or node["metadata"]["name"] in wanted
        ]
        missing = wanted - {m.name for m in listed}
        if missing:
            raise UsageError(f"no such node: {', '.join(sorted(missing))}")
        shown = [m for m in listed if m.marked or m.people or args.all or wanted]
        lines = [f"judged with the settings of {settings.source}"]
        for marks in shown:
            lines.append(
                f"{marks.name}:"
                if marks.marked or marks.people
                else f"{marks.name}: no mark of ours"
            )
            lines += [f"  {line}" for line in marks.lines]
            lines += [f"  {line}" for line in marks.people]
        if not shown:
            lines.append("no Node carries a mark of ours")
        _emit(out, as_json, [m.as_json() for m in shown], lines)
        return OK
    if args.command == "cleanup":
        return _cleanup(args, api, out, as_json)
    if args.command == "replay":
        return _replay(args, api, out, err, as_json)
    raise UsageError(f"unknown command {args.command}")  # pragma: no cover - argparse refuses


def _cleanup(args: argparse.Namespace, api: kube.Kube, out: TextIO, as_json: bool) -> int:
    label: str | None = args.pressure_label
    kept = ""
    if label is None:
        settings = installed_settings(api, args.installed_in)
        if settings.installed:
            label = settings.cfg.pressure_label
        else:
            # After an uninstall the settings are gone, and with them which label label-nodes
            # wrote: the default's key may well be someone else's (the original scheduler's
            # status=presure), and the pressure record does not name its label.
            kept = (
                "the pressure label is left on every node: which label label-nodes wrote is "
                f"not known ({settings.source}); name it with --pressure-label KEY=VALUE"
            )
    elif not re.fullmatch(r"[^=\s]+=[^=\s]*", label):
        raise UsageError(f"--pressure-label {label!r}: write it KEY=VALUE, as status=presure")
    if not args.yes and not args.dry_run:
        found = cleanup.plans(api, pressure_label=label)
        lines = [cleanup.listed(plan) for plan in found]
        lines.append(
            f"{len(found)} object(s) carry marks of kn-rescheduler"
            + ("; run again with --yes to remove them" if found else "")
        )
        if kept:
            lines.append(kept)
        data = [
            {"kind": p.kind, "namespace": p.namespace, "name": p.name, "remove": list(p.removed)}
            for p in found
        ]
        _emit(out, as_json, data, lines)
        return OK
    dry = args.dry_run == "server"
    report = cleanup.clean(api.with_options(dry_run=dry), pressure_label=label)
    prefix = "(server dry run) " if dry else ""
    lines = [prefix + line for line in report]
    lines.append(f"{len(report)} object(s) carried marks of kn-rescheduler")
    if kept:
        lines.append(kept)
    _emit(out, as_json, {"dryRun": dry, "report": report, "pressureLabel": label}, lines)
    return OK


def _replay(
    args: argparse.Namespace, api: kube.Kube, out: TextIO, err: TextIO, as_json: bool
) -> int:
    """The events the functions logged (or those of FILE) through the functions' own code,
    routed by the installed Triggers, with the installed settings, every write a server-side
    dry run. Exit 1 when an event was not handled."""
    where = args.installed_in
    if args.file:
        try:
            lines = Path(args.file).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise UsageError(f"cannot read {args.file}: {exc.strerror}") from exc
        source = args.file
    else:
        logs = recorded.function_logs(api, where)
        if not logs.pods:
            raise UsageError(
                f"no function pod in namespace {where}: is kn-rescheduler installed there? "
                "(--installed-in NAMESPACE)"
            )
        for why in logs.unreadable:
            err.write(shown(f"replay: a log not read: {why}") + "\n")
        lines = list(logs.lines)
        source = f"the logs of {logs.pods} function pod(s) in {where}"
    made = archive.collect(lines)
    if args.save:
        _write_whole(Path(args.save), made.lines())
    routes, refused = recorded.installed_triggers(api, where)
    for why in refused:
        err.write(shown(f"replay: a Trigger Knative would refuse, left out: {why}") + "\n")
    if not routes:
        raise UsageError(f"no Trigger of the Broker default in namespace {where}: nothing routes")
    settings = installed_settings(api, where)
    chosen = [e for e in made.events if replay.Selection(args.type, args.subject, args.id)(e)]
    sender = replay.InProcess(settings.cfg, lambda: api, routes)
    said = io.StringIO()
    outcomes = replay.replay(
        chosen, sender, dry_run=True, recorded_speed=False, out=said, as_json=as_json
    )
    failed = sum(1 for o in outcomes if not o.ok)
    summary = (
        f"replayed {len(chosen)} of {len(made.events)} event(s) from {source} "
        f"({made.duplicates} logged again by another function, {made.not_events} other line(s)): "
        f"{len(outcomes) - failed} handled, {failed} failed; routed by the {len(routes)} "
        f"Trigger(s) in {where}, with the settings of {settings.source}, every write a server "
        "dry run"
    )
    if as_json:
        out.write(said.getvalue())
        err.write(shown(summary) + "\n")
    else:
        _emit(out, False, None, [*said.getvalue().splitlines(), summary])
    return FAILED if failed else OK


def _write_whole(path: Path, lines: Sequence[str]) -> None:
    """``lines`` to ``path``, whole or not at all (a partial archive would replay as if whole)."""
    partial = path.with_name(path.name + ".partial")
    try:
        partial.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
        partial.replace(path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise UsageError(f"cannot write {path}: {exc.strerror}") from exc
