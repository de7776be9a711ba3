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
import json
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Final, TextIO

from kubectl_kn_rescheduler import cleanup, explain, nodes, status
from kubectl_kn_rescheduler.reading import UsageError, installed_settings, parse_target
from shared.api.keys import DEFAULT_NAMESPACE, PRESSURE_LABEL_KEY
from shared.platform import kube

OK = 0
FAILED = 1
USAGE = 2

EPILOG = """commands:
  status TYPE/NAME   a workload's moves, budget, excluded nodes, stop, pods and Events
  explain POD        what kn-rescheduler will do about a pod and why, by the functions' code
  nodes [NODE...]    every mark of ours on Nodes: why, since when, until when
  cleanup            list every mark of ours; --yes removes them (after an uninstall)

Read-only unless asked: only `cleanup --yes` writes, and `explain` sends the writes it would
make as server-side dry runs (validated by the API server, never stored).
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


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="kubectl kn-rescheduler",
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
        "--pressure-label-key",
        default=PRESSURE_LABEL_KEY,
        help="the key of KN_RESCHEDULER_PRESSURE_LABEL, if you changed it (default: %(default)s)",
    )
    return top


def main(
    argv: Sequence[str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    now: datetime | None = None,
) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    args = parser().parse_args(argv)
    try:
        api = kube.Kube.from_environment(
            kubeconfig=args.kubeconfig, context=args.context, timeout=15.0
        )
    except kube.KubeError as exc:
        print(f"kubectl-kn_rescheduler: {exc}", file=err)
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
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"kubectl-kn_rescheduler: the API server: {first}", file=err)
        return FAILED


# Control characters (C0 but tab, DEL, C1): names, reasons and Event messages are written by
# anyone who can write a workload or an Event, and a terminal obeys escape sequences.
_CONTROL: Final = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def shown(line: str) -> str:
    """``line`` safe for a terminal: each control character as its ``\\xNN`` escape."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", line)


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
        found = status.gather(api, kind, namespace, name)
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
    raise UsageError(f"unknown command {args.command}")  # pragma: no cover - argparse refuses


def _cleanup(args: argparse.Namespace, api: kube.Kube, out: TextIO, as_json: bool) -> int:
    key = args.pressure_label_key
    if not args.yes and not args.dry_run:
        found = cleanup.plans(api, pressure_key=key)
        lines = [cleanup.listed(plan) for plan in found]
        lines.append(
            f"{len(found)} object(s) carry marks of kn-rescheduler"
            + ("; run again with --yes to remove them" if found else "")
        )
        data = [
            {"kind": p.kind, "namespace": p.namespace, "name": p.name, "remove": list(p.removed)}
            for p in found
        ]
        _emit(out, as_json, data, lines)
        return OK
    dry = args.dry_run == "server"
    report = cleanup.clean(api.with_options(dry_run=dry), pressure_key=key)
    prefix = "(server dry run) " if dry else ""
    lines = [prefix + line for line in report]
    lines.append(f"{len(report)} object(s) carried marks of kn-rescheduler")
    _emit(out, as_json, {"dryRun": dry, "report": report}, lines)
    return OK
