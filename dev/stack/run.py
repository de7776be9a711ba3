"""``python -m dev.stack.run --dir DIR``: the pipeline as one long-running process.

``make up`` runs it as a component of the local cluster's supervisor (KUBECONFIG set): it
starts every function, the Broker (Knative's data plane) and the event source, writes
``DIR/stack.json`` (URLs, the archive, the logs) and stops them all on SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from dev.localcluster.realnode import REAL_KUBELET_FUNCTION_SETTINGS
from dev.stack.stack import Stack

STACK_FILE = "stack.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.stack.run")
    parser.add_argument("--dir", required=True, help="where the archive and stack.json go")
    parser.add_argument("--log-dir", help="function logs (default DIR/logs)")
    parser.add_argument("--sweep-every", type=float, default=300.0, help="seconds, 0 = never")
    parser.add_argument(
        "--prometheus-url", help="the Prometheus label-nodes asks (default: none, not started)"
    )
    parser.add_argument(
        "--score-nodes-port", type=int, help="the port score-nodes listens on (default: any)"
    )
    parser.add_argument(
        "--real-kubelets",
        action="store_true",
        help="the functions' default thresholds, for a cluster of real nodes only (default: "
        "the thresholds compressed to the fake kubelet's clock)",
    )
    args = parser.parse_args(argv)
    directory = Path(args.dir).resolve()
    kubeconfig = Path(os.environ["KUBECONFIG"])
    configuration = k8s.Configuration()
    k8s_config.load_kube_config(str(kubeconfig), client_configuration=configuration)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stack = Stack(
        kubeconfig,
        k8s.ApiClient(configuration),
        directory / "stack",
        Path(args.log_dir) if args.log_dir else directory / "logs",
        sweep_every=args.sweep_every or None,
        prometheus_url=args.prometheus_url or None,
        score_nodes_port=args.score_nodes_port,
        settings=REAL_KUBELET_FUNCTION_SETTINGS if args.real_kubelets else None,
    )
    stack.start()
    try:
        (directory / STACK_FILE).write_text(stack.info().to_json())
        print(f"stack ready: {stack.info().to_json()}", flush=True)
        stop.wait()
    finally:
        (directory / STACK_FILE).unlink(missing_ok=True)
        stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
