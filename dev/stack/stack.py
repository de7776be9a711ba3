"""The whole event pipeline on a local control plane, wired as Knative wires it.

    kube-apiserver -> ApiServerSource adapter (Knative's own, configured from the
    ApiServerSource of knative/sources.yaml: opted-in pods only) -> Broker (Knative's own
    ingress, in-memory channel dispatcher and filter: dev/pipeline/broker.py, with the Broker and
    Triggers of knative/) -> detect-failures -> Broker -> update-annotations -> Broker;
    kube-apiserver -> mutate-admission (TLS, registered), or with ``admission="policies"`` the
    MutatingAdmissionPolicies of knative/components/admission-policies, and no webhook at all;
    Broker -> assess-nodes (failure reports: node health) -> Broker;
    a timer (the PingSources) -> sweep-failures -> Broker, and -> assess-nodes;
    a timer -> label-nodes -> the cluster's Prometheus (when the Stack is given its URL);
    a timer -> annotate-usage -> the same Prometheus -> Nodes' usage annotations and load labels;
    a timer -> rebalance-nodes -> evictions from hot nodes (when asked: ``rebalance_every``);
    kube-scheduler (a second one, profile kn-rescheduler-load-aware) -> score-nodes.

Each function is its own gunicorn process started with the image's command line; one that dies
(killed, crashed) is started again on the same port within a fraction of a second, as the
kubelet restarts a container (``restart_functions``, on by default). ``Stack``
is used by the end-to-end tests and the demo in-process, and by ``python -m dev.stack.run`` as a
component of the ``make up`` supervisor.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import requests
from kubernetes import client as k8s

from dev.pipeline.broker import KnativeBroker
from dev.pipeline.source import ApiServerSource
from dev.stack import admission_policies
from dev.stack import webhook as webhook_setup
from dev.stack.functions import ROOT, FunctionServer, Watchdog, environment, free_port

log = logging.getLogger(__name__)

PING_TYPE: Final = "dev.knative.sources.ping"
LOCAL_PRESSURE_RULES: Final = ROOT / "dev" / "stack" / "pressure-rules.yaml"
# How new pods get their exclusions: the webhook, or MutatingAdmissionPolicies (Kubernetes 1.36).
ADMISSION_MODES: Final = ("webhook", "policies")
TRIGGERED_FUNCTIONS: Final = ("detect-failures", "update-annotations", "assess-nodes")


def read_archive(path: Path) -> list[dict[str, Any]]:
    """The events of a JSON-lines archive another thread is appending to, in order.

    The receiver writes each event as one line, but a line longer than the file buffer (a
    pod event is 5 to 10 kB) reaches the file in more than one write: a line without its
    newline yet is left for the next read rather than parsed half-written.
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    complete = text[: text.rfind("\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()]


@dataclass(frozen=True)
class StackInfo:
    """Where things are, for people and for ``make up``'s state file."""

    broker: str
    functions: Mapping[str, str]
    archive: str
    dead_letters: str
    log_dir: str

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=2, default=dict)


class Stack:
    def __init__(
        self,
        kubeconfig: Path,
        api_client: k8s.ApiClient,
        workdir: Path,
        log_dir: Path,
        *,
        settings: Mapping[str, str] | None = None,
        sweep_every: float | None = 300.0,
        assess_every: float | None = 60.0,
        prometheus_url: str | None = None,
        label_every: float | None = 10.0,
        usage_every: float | None = 10.0,
        rebalance_every: float | None = None,
        score_nodes_port: int | None = None,
        triggers_dir: Path = ROOT / "knative",
        restart_functions: bool = True,
        async_handler: bool | None = None,
        kubeconfigs: Mapping[str, Path] | None = None,
        admission: str = "webhook",
    ) -> None:
        if admission not in ADMISSION_MODES:
            raise ValueError(f"admission must be one of {', '.join(ADMISSION_MODES)}")
        # "webhook": mutate-admission, registered; "policies": the MutatingAdmissionPolicies
        # rendered from this stack's settings, and no webhook process at all.
        self.admission = admission
        self.kubeconfig = kubeconfig
        # A function's own credentials instead of ``kubeconfig``: the scale bench gives each its
        # identity, so that the API server's metrics tell their requests apart.
        self.kubeconfigs = dict(kubeconfigs or {})
        self.api_client = api_client
        self.workdir = workdir
        self.log_dir = log_dir
        self.settings = dict(settings or {})
        self.sweep_every = sweep_every
        self.assess_every = assess_every
        # label-nodes runs only with a Prometheus to ask (the local cluster's, by default).
        self.prometheus_url = prometheus_url
        self.label_every = label_every
        # annotate-usage, like label-nodes, only with a Prometheus to ask.
        self.usage_every = usage_every
        # rebalance-nodes reads the usage annotate-usage writes: only with a Prometheus too, and
        # only when asked (the demo and the tests drive it themselves).
        self.rebalance_every = rebalance_every
        # score-nodes on a port chosen before the scheduler that calls it was configured.
        self.score_nodes_port = score_nodes_port
        self.triggers_dir = triggers_dir
        self.archive = workdir / "archive.jsonl"
        self.dead_letters = workdir / "dead-letters.jsonl"
        self.servers: dict[str, FunctionServer] = {}
        self.broker: KnativeBroker | None = None
        self.source: ApiServerSource | None = None
        self._ping_stop = threading.Event()
        self._ping_threads: list[threading.Thread] = []
        self.restart_functions = restart_functions
        # None: the channel's fan-out mode is what knative/broker.yaml says.
        self.async_handler = async_handler
        self._watchdog: Watchdog | None = None
        self.broker_url = ""

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Stack:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        broker_port = free_port()
        # The host's way into the Broker (the namespace and name are the Broker manifest's).
        self.broker_url = f"http://127.0.0.1:{broker_port}/kn-rescheduler/default"

        def env_of(function: str) -> dict[str, str]:
            kubeconfig = self.kubeconfigs.get(function, self.kubeconfig)
            return environment(kubeconfig, **self.settings)

        for name in TRIGGERED_FUNCTIONS:
            self.servers[name] = FunctionServer(name, self.log_dir, env=env_of(name)).start()
        self.servers["sweep-failures"] = FunctionServer(
            "sweep-failures",
            self.log_dir,
            env={**env_of("sweep-failures"), "K_SINK": self.broker_url},
        ).start()
        if self.prometheus_url:
            self.servers["label-nodes"] = FunctionServer(
                "label-nodes",
                self.log_dir,
                env={
                    **env_of("label-nodes"),
                    "KN_RESCHEDULER_PROMETHEUS_URL": self.prometheus_url,
                    # The built-in rules with a 10 s CPU window: the local clock is compressed.
                    "KN_RESCHEDULER_PRESSURE_RULES_FILE": str(LOCAL_PRESSURE_RULES),
                    **self.settings,
                },
            ).start()
        if self.prometheus_url:
            self.servers["annotate-usage"] = FunctionServer(
                "annotate-usage",
                self.log_dir,
                env={
                    **env_of("annotate-usage"),
                    "KN_RESCHEDULER_PROMETHEUS_URL": self.prometheus_url,
                    # A 10 s rate: Prometheus scrapes the local nodes every second.
                    "KN_RESCHEDULER_USAGE_RATE_WINDOW": "10s",
                    **self.settings,
                },
            ).start()
        if self.prometheus_url and self.rebalance_every:
            self.servers["rebalance-nodes"] = FunctionServer(
                "rebalance-nodes", self.log_dir, env=env_of("rebalance-nodes")
            ).start()
        self.servers["score-nodes"] = FunctionServer(
            "score-nodes", self.log_dir, env=env_of("score-nodes"), port=self.score_nodes_port
        ).start()
        hook: FunctionServer | None = None
        if self.admission == "webhook":
            ca, crt, key = webhook_setup.make_tls(self.workdir / "tls")
            hook = FunctionServer(
                "mutate-admission",
                self.log_dir,
                env=env_of("mutate-admission"),
                tls=(crt, key),
                ca_file=ca,
            ).start()
            self.servers["mutate-admission"] = hook

        self.broker = KnativeBroker(
            self.kubeconfig,
            self.api_client,
            self.triggers_dir,
            {name: self.servers[name].url for name in TRIGGERED_FUNCTIONS},
            self.workdir,
            self.log_dir,
            archive=self.archive,
            dead_letters=self.dead_letters,
            port=broker_port,
            async_handler=self.async_handler,
        ).start()
        self.broker_url = self.broker.url
        if hook is not None:
            webhook_setup.register(self.api_client, webhook_setup.configuration(hook.url, ca))
        else:
            admission_policies.install(
                self.api_client, admission_policies.rendered(env_of("mutate-admission"))
            )
            admission_policies.wait_until_params(self.api_client)
        # Either way the same probe: a dry-run opted-in pod comes back labelled.
        webhook_setup.wait_until_called(self.api_client)
        # What the cluster's ApiServerSource watches, label selector included: only pods the
        # webhook labelled as opted in produce events.
        # The adapter runs beside the Broker in its network namespace, as the ApiServerSource's
        # Deployment runs in the cluster; its sink is the Broker's address there.
        self.source = ApiServerSource.from_manifest(
            self.broker.namespace_kubeconfig,
            self.broker.source_url,
            manifest=self.triggers_dir / "sources.yaml",
            log_path=self.log_dir / "apiserversource.log",
            wrap=self.broker.wrap,
        )
        self.source.start()
        for function, every in (
            ("sweep-failures", self.sweep_every),
            ("assess-nodes", self.assess_every),
            ("label-nodes", self.label_every),
            ("annotate-usage", self.usage_every),
            ("rebalance-nodes", self.rebalance_every),
        ):
            if every and function in self.servers:
                thread = threading.Thread(
                    target=self._ping_loop, args=(function, every), daemon=True
                )
                thread.start()
                self._ping_threads.append(thread)
        if self.restart_functions:
            self._watchdog = Watchdog(self.servers).start()

    def stop(self) -> None:
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            # No restart from now on; the functions it restarted stop before its thread ends.
            watchdog.stop(then=self._stop)
        else:
            self._stop()

    def _stop(self) -> None:
        self._ping_stop.set()
        for thread in self._ping_threads:
            thread.join(timeout=5)
        self._ping_threads.clear()
        if self.source is not None:
            self.source.stop()
            self.source = None
        try:
            if self.admission == "webhook":
                webhook_setup.unregister(self.api_client)
            else:
                # Disabled, not deleted: see dev/stack/admission_policies.py.
                admission_policies.disable(self.api_client)
        except Exception as exc:  # the cluster may already be gone
            log.debug("could not unregister the admission: %s", exc)
        if self.broker is not None:
            self.broker.stop()
            self.broker = None
        for server in self.servers.values():
            server.stop()
        self.servers.clear()

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what the kubelet does -------------------------------------------------------------------

    def restarts(self) -> dict[str, int]:
        """How often each function was started again after its process died."""
        return {name: server.restarts for name, server in self.servers.items()}

    # -- what the PingSource does ---------------------------------------------------------------

    def sweep_now(self) -> int:
        """POST one PingSource event to sweep-failures; its HTTP status."""
        return self.ping("sweep-failures")

    def ping(self, function: str) -> int:
        """POST one PingSource event to ``function``, as its PingSource would; the status."""
        body = {"message": "tick"}
        headers = {
            "ce-specversion": "1.0",
            "ce-id": str(uuid.uuid4()),
            "ce-source": f"/apis/v1/namespaces/kn-rescheduler/pingsources/{function}",
            "ce-type": PING_TYPE,
            "content-type": "application/json",
        }
        response = requests.post(self.servers[function].url, json=body, headers=headers, timeout=60)
        return response.status_code

    def _ping_loop(self, function: str, every: float) -> None:
        while not self._ping_stop.wait(every):
            try:
                self.ping(function)
            except requests.RequestException as exc:
                log.warning("%s ping failed: %s", function, exc)

    # -- for people -----------------------------------------------------------------------------

    def info(self) -> StackInfo:
        return StackInfo(
            broker=self.broker_url,
            functions={name: server.url for name, server in self.servers.items()},
            archive=str(self.archive),
            dead_letters=str(self.dead_letters),
            log_dir=str(self.log_dir),
        )

    def archived(self) -> list[dict[str, Any]]:
        """Every event the Broker accepted so far (its archive Trigger's copy), in order."""
        return read_archive(self.archive)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        return self.broker.wait_idle(timeout) if self.broker else True
