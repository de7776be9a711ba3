"""``python -m dev.localcluster up|down|status --dir .local``: a local cluster that outlives the
shell.

``up`` builds the binaries if needed (progress on stderr), starts a detached supervisor process
that owns the cluster, and returns once the cluster is ready, printing the kubeconfig path and
the log directory. ``down`` stops the supervisor (which stops every process in order) and waits
until no process of the cluster is left. ``status`` reports what runs.

The supervisor's state is ``<dir>/state.json``; its log is ``<dir>/logs/supervisor.log``.
The cluster includes a real Prometheus scraping one node-exporter endpoint per node (its URL is
printed and recorded as ``prometheus_url``); ``up --no-prometheus`` leaves it out.

More processes can join the same supervisor: ``up --with package.module:function`` calls
``function(cluster)`` once the cluster is ready; it returns :class:`localcluster.Component`
objects (a function under development, a Broker), started with ``KUBECONFIG`` set, logged in the
same log directory and stopped with the cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from dev.localcluster.bins import BinsError, ensure_bins
from dev.localcluster.cluster import Cluster, ClusterError
from dev.localcluster.procs import Component, cmdline, names_path, pid_alive
from dev.localcluster.rest import Rest

STATE_FILE = "state.json"
SUPERVISOR_LOG = "supervisor.log"
UP_TIMEOUT = 300.0
DOWN_TIMEOUT = 60.0

ComponentFactory = Callable[[Cluster], Iterable[Component]]


def _display(path: Path) -> str:
    """``path`` relative to the working directory when inside it (what the user typed)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _read_state(directory: Path) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads((directory / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return state


def _write_state(directory: Path, state: dict[str, Any]) -> None:
    tmp = directory / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
    tmp.replace(directory / STATE_FILE)


def _supervisor_alive(directory: Path, state: dict[str, Any] | None) -> int | None:
    """The supervisor's pid if it still runs (checked by pid and command line)."""
    if not state:
        return None
    pid = int(state.get("supervisor_pid", 0))
    if pid and pid_alive(pid):
        args = cmdline(pid)
        if "_supervise" in args and str(directory) in args:
            return pid
    return None


def cluster_processes(directory: Path, bins_dir: str | None) -> list[int]:
    """Live processes of the cluster in ``directory``: the supervisor, and every process
    started from the binaries directory, or a ``prometheus`` binary (a system package, not
    ours to build), whose command line names ``directory``."""
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        args = cmdline(pid)
        if not names_path(args, str(directory)) or not pid_alive(pid):
            continue
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            exe = ""
        ours = (
            (bins_dir is not None and exe.startswith(bins_dir.rstrip("/") + "/"))
            or os.path.basename(exe) == "prometheus"
            or ("_supervise" in args and "dev.localcluster" in args)
        )
        if ours:
            found.append(pid)
    return found


def _load_factories(specs: list[str]) -> list[ComponentFactory]:
    factories = []
    for spec in specs:
        module, _, attr = spec.partition(":")
        if not module or not attr:
            raise SystemExit(f"--with expects package.module:function, got {spec!r}")
        factories.append(getattr(importlib.import_module(module), attr))
    return factories


# -- supervisor ---------------------------------------------------------------------------------


def supervise(args: argparse.Namespace) -> int:
    directory = Path(args.dir).resolve()
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)

    state: dict[str, Any] = {"status": "starting", "supervisor_pid": os.getpid()}
    _write_state(directory, state)
    cluster = Cluster(
        directory,
        nodes=args.nodes,
        real_nodes=args.real_nodes,
        bins_dir=Path(args.bins),
        keep_workdir=True,
        prometheus=args.prometheus,
    )
    try:
        factories = _load_factories(args.with_)
        cluster.start()
        for factory in factories:
            for component in factory(cluster):
                cluster.start_component(
                    component, deadline=time.monotonic() + component.ready_timeout
                )
    except BaseException as e:  # report any failure to the waiting `up`
        cluster.stop(remove=False)
        _write_state(directory, {**state, "status": "failed", "error": str(e)})
        print(f"start failed: {e}", file=sys.stderr, flush=True)
        return 1
    state = {**state, **cluster.state(), "status": "ready"}
    _write_state(directory, state)
    print(f"ready: {json.dumps(state)}", flush=True)

    while not stop.wait(1.0):
        prometheus = cluster.prometheus.proc if cluster.prometheus is not None else None
        dead = [p for p in [*cluster.procs, *filter(None, [prometheus])] if not p.alive()]
        if dead and state.get("status") == "ready":
            names = ", ".join(f"{p.name} (exit {p.returncode})" for p in dead)
            print(f"degraded: {names} exited", file=sys.stderr, flush=True)
            state = {**state, "status": "degraded", "error": f"exited: {names}"}
            _write_state(directory, state)
    _write_state(directory, {**state, "status": "stopping"})
    cluster.stop(remove=False)
    _write_state(directory, {**state, "status": "stopped", "pids": {}})
    print("stopped", flush=True)
    return 0


# -- commands -----------------------------------------------------------------------------------


def up(args: argparse.Namespace) -> int:
    directory = Path(args.dir).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    state = _read_state(directory)
    running = _supervisor_alive(directory, state)
    if running:
        print(f"a local cluster is already running in {_display(directory)}", file=sys.stderr)
        # It may still be starting (another `up` in progress): wait for it like that `up` does.
        return _await_ready(directory, lambda: pid_alive(running), args.timeout)
    try:
        bins = ensure_bins()
    except BinsError as e:
        print(f"cannot build the binaries: {e}", file=sys.stderr)
        return 1
    (directory / STATE_FILE).unlink(missing_ok=True)
    log_dir = directory / "logs"
    log_dir.mkdir(exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "dev.localcluster",
        "_supervise",
        "--dir",
        str(directory),
        "--nodes",
        str(args.nodes),
        "--real-nodes",
        str(args.real_nodes),
        "--bins",
        str(bins),
    ]
    for spec in args.with_:
        argv += ["--with", spec]
    if not args.prometheus:
        argv.append("--no-prometheus")
    with (log_dir / SUPERVISOR_LOG).open("wb") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # survives this shell; Ctrl-C here does not reach it
            cwd=Path.cwd(),
            close_fds=True,
        )
    code = _await_ready(directory, lambda: proc.poll() is None, args.timeout)
    if code == 2:
        print("timed out waiting for the local cluster; stopping it", file=sys.stderr)
        return down(args) or 1
    if code != 0:
        proc.wait()
    return code


def _await_ready(directory: Path, alive: Callable[[], bool], timeout: float) -> int:
    """0 once the supervisor reports ready, 1 if it failed or died, 2 on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = _read_state(directory)
        status = (state or {}).get("status")
        if state is not None and status in ("ready", "degraded"):
            _print_ready(state)
            return 0
        if status in ("failed", "stopping", "stopped") or not alive():
            error = (state or {}).get("error", f"the supervisor ended ({status or 'no state'})")
            print(f"local cluster failed to start: {error}", file=sys.stderr)
            print(f"logs: {_display(directory / 'logs')}", file=sys.stderr)
            return 1
        time.sleep(0.2)
    return 2


def _print_ready(state: dict[str, Any]) -> None:
    kubeconfig = _display(Path(state["kubeconfig"]))
    seconds = state.get("startup_seconds")
    took = f" in {seconds:.1f}s" if isinstance(seconds, int | float) else ""
    print(f"local cluster ready{took}: {state['server']} ({len(state['nodes'])} nodes)")
    print(f"kubeconfig: {kubeconfig}")
    print(f"logs: {_display(Path(state['log_dir']))}")
    if state.get("prometheus_url"):
        print(f"prometheus: {state['prometheus_url']} (node-exporter metrics of every node)")
    print(f"  export KUBECONFIG={kubeconfig}")


def down(args: argparse.Namespace) -> int:
    directory = Path(args.dir).resolve()
    state = _read_state(directory)
    bins_dir = (state or {}).get("bins_dir")
    pid = _supervisor_alive(directory, state)
    if pid:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + args.timeout
    recorded = [int(p) for p in ((state or {}).get("pids") or {}).values()]
    if (state or {}).get("prometheus_pid"):
        recorded.append(int((state or {})["prometheus_pid"]))
    while time.monotonic() < deadline:
        left = cluster_processes(directory, bins_dir)
        if not left and not (pid and pid_alive(pid)):
            break
        time.sleep(0.2)
    # Whatever is still there after the orderly stop gets SIGKILL (ours only, by pid).
    left = cluster_processes(directory, bins_dir)
    for p in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    end = time.monotonic() + 10
    while time.monotonic() < end and (
        cluster_processes(directory, bins_dir) or any(pid_alive(p) for p in recorded)
    ):
        time.sleep(0.1)
    remaining = cluster_processes(directory, bins_dir)
    if remaining:
        print(f"processes still alive: {remaining}", file=sys.stderr)
        return 1
    if state is None and not pid:
        print(f"no local cluster was running in {_display(directory)}")
    else:
        print(f"local cluster in {_display(directory)} stopped; no process left")
    return 0


def status(args: argparse.Namespace) -> int:
    directory = Path(args.dir).resolve()
    state = _read_state(directory)
    pid = _supervisor_alive(directory, state)
    if state is None or not pid:
        print(f"not running ({_display(directory)})")
        return 3
    print(f"supervisor {pid}: {state.get('status')}")
    healthy = state.get("status") == "ready"
    for name, p in (state.get("pids") or {}).items():
        alive = pid_alive(int(p))
        healthy = healthy and alive
        print(f"  {name:<24} pid {p:<8} {'running' if alive else 'GONE'}")
    prometheus_pid = state.get("prometheus_pid")
    if prometheus_pid:
        alive = pid_alive(int(prometheus_pid))
        healthy = healthy and alive
        print(
            f"  {'prometheus':<24} pid {prometheus_pid:<8} {'running' if alive else 'GONE'} "
            f"({state.get('prometheus_url')})"
        )
    server = state.get("server")
    if server:
        pki_dir = directory / "pki"
        rest = Rest(
            server,
            ca_file=pki_dir / "ca.crt",
            cert_file=pki_dir / "admin.crt",
            key_file=pki_dir / "admin.key",
        )
        code, body = rest.text("/readyz", 2.0)
        print(f"  kube-apiserver {server} /readyz: {code} {body.strip()[:60]}")
        healthy = healthy and code == 200
        print(f"kubeconfig: {_display(Path(state['kubeconfig']))}")
        print(f"logs: {_display(Path(state['log_dir']))}")
    return 0 if healthy else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dev.localcluster", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, helptext in (
        ("up", "start a cluster in a detached supervisor and wait until it is ready"),
        ("down", "stop the cluster and wait until none of its processes is left"),
        ("status", "show the supervisor, the processes and the API server's readiness"),
        ("_supervise", argparse.SUPPRESS),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--dir", default=".local", help="work directory (default .local)")
        if name in ("up", "_supervise"):
            p.add_argument("--nodes", type=int, default=4, help="number of kwok nodes (4)")
            p.add_argument(
                "--real-nodes",
                type=int,
                default=0,
                help="number of real nodes, a kubelet and a containerd each (0; needs root)",
            )
            p.add_argument(
                "--with",
                dest="with_",
                action="append",
                default=[],
                metavar="MODULE:FUNCTION",
                help="extra components: FUNCTION(cluster) returns localcluster.Component objects",
            )
            p.add_argument(
                "--prometheus",
                action=argparse.BooleanOptionalAction,
                default=True,
                help="run a real Prometheus scraping every node (default: yes)",
            )
        if name in ("up", "down"):
            p.add_argument(
                "--timeout", type=float, default=UP_TIMEOUT if name == "up" else DOWN_TIMEOUT
            )
        if name == "_supervise":
            p.add_argument("--bins", required=True)
    args = parser.parse_args(argv)
    commands = {"up": up, "down": down, "status": status, "_supervise": supervise}
    try:
        return commands[args.command](args)
    except ClusterError as e:
        print(str(e), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
