"""Runtime configuration: one `Config` of every setting, of which each function reads its own.

Settings come from environment variables `KN_RESCHEDULER_<FIELD>` (what a Knative Service sets in
`env:`, or loads from the settings ConfigMap with `envFrom`), optionally layered over a mounted
YAML or JSON file whose keys are the field names (what a ConfigMap volume gives). The environment
wins, so a single Service can override one knob without a second ConfigMap.

Every function gets the whole ConfigMap, but reads, checks and logs only the settings its code
reads (`Config.for_function`, the table in shared.platform.reads, generated from the code): a bad
value of a rebalancing limit stops rebalance-nodes, not the webhook, and a function's start-up
log shows what it runs with, not sixty settings it never looks at.

A value we cannot read stops the function at start-up with a `ConfigError` naming the variable:
a rescheduler that silently falls back to defaults could delete pods its operator meant to
protect.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

import yaml

from shared.api.keys import DEFAULT_NAMESPACE, PRESSURE_LABEL_KEY, PRESSURE_LABEL_VALUE
from shared.api.times import parse_duration
from shared.platform.profiles import DEFAULT_PROFILE, PROFILES
from shared.platform.reads import READS

# A bound on what a user can ask for: enough for any sane workload, small enough that a typo
# ("30000") cannot turn the rescheduler into a pod-deleting loop.
MAX_RETRIES: Final = 100

# Where annotate-usage reads node usage.
USAGE_SOURCE_PROMETHEUS: Final = "prometheus"
USAGE_SOURCE_METRICS_API: Final = "metrics-api"
USAGE_SOURCES: Final = (USAGE_SOURCE_PROMETHEUS, USAGE_SOURCE_METRICS_API)

ENV_PREFIX: Final = "KN_RESCHEDULER_"
# Where a mounted config file is looked for when the caller names none.
CONFIG_FILE_ENV: Final = ENV_PREFIX + "CONFIG_FILE"

# Kubelet waiting reasons that a different node can plausibly fix. CrashLoopBackOff is not
# here: it is judged separately, only after `crashloop_restart_threshold` restarts.
DEFAULT_WAITING_REASONS: Final = frozenset(
    {
        "RunContainerError",
        "CreateContainerError",
        "ContainerCannotRun",
        "ImagePullBackOff",
        "ErrImagePull",
    }
)
DEFAULT_TERMINATION_REASONS: Final = frozenset({"OOMKilled"})
# status.reason of a pod in phase Failed that the node put it in: eviction under pressure,
# admission rejections by the kubelet (OutOf*, NodeAffinity, UnexpectedAdmissionError), a lost
# node. Not a graceful node shutdown (Terminated, and Shutdown from v1.21 kubelets): a planned
# reboot is no fault of the node, and its pods' controllers place their replacements elsewhere
# while it is down; counted, two opted-in workloads on a node being drained for maintenance
# made it suspect.
DEFAULT_FAILED_POD_REASONS: Final = frozenset(
    {
        "Evicted",
        "OutOfcpu",
        "OutOfmemory",
        "OutOfpods",
        "OutOfephemeral-storage",
        "NodeAffinity",
        "UnexpectedAdmissionError",
        "NodeLost",
    }
)
# Failures that follow the pod to every node (a missing Secret, a malformed or never-pull
# image): moving would burn the budget and fix nothing, so no configuration may enable them.
NEVER_MOVE_REASONS: Final = frozenset(
    {"CreateContainerConfigError", "InvalidImageName", "ErrImageNeverPull"}
)
# What a failure message says when the image or its entrypoint is broken: every node would fail
# the same way, so these are never moved either (matched case-insensitively). Not configurable,
# like NEVER_MOVE_REASONS. The rules are a table in docs/failure-rules.md.
#
# Pull errors the registry itself answers (the tag or repository does not exist, the
# credentials are refused) follow the pod everywhere; a timeout, a refused connection or a DNS
# failure is the node's network (or its local mirror) and stays movable. Applied to the message
# of ErrImagePull / ImagePullBackOff only.
IMAGE_EVERYWHERE_PATTERNS: Final = (
    r"\bnot found\b",
    r"manifest unknown",
    r"name unknown",
    r"unauthorized",
    r"\b401\b",
    r"\bdenied\b",
    r"forbidden",
    r"\b403\b",
)
# The runtime's `exec: "cmd": ...` errors mean the command is not in the image (or is not
# executable): applied to the message of a container that could not be started
# (RunContainerError, CreateContainerError, ContainerCannotRun, and the last termination of a
# container in CrashLoopBackOff, where containerd reports it as StartError). Only the exec
# form: a mount source missing on one node ("error mounting ... no such file or directory")
# is the node's and stays movable.
START_EVERYWHERE_PATTERNS: Final = (
    r'exec: "[^"]*": [^\n]*(?:no such file or directory|executable file not found|permission '
    r"denied)",
)
DEFAULT_EXCLUDED_NAMESPACES: Final = frozenset({"kube-system", DEFAULT_NAMESPACE})
# Node conditions that make a node suspect before any pod fails there: the problem conditions
# node-problem-detector's shipped monitors set True for a problem that does not go away by itself
# (config/kernel-monitor.json, readonly-monitor.json, docker-monitor.json,
# systemd-monitor-counter.json, health-checker-containerd.json of kubernetes/node-problem-
# detector). Not the kubelet's MemoryPressure, DiskPressure and PIDPressure: the kubelet acts on
# those itself (it taints the node NoSchedule and evicts), and they come and go with load.
DEFAULT_SUSPECT_CONDITIONS: Final = frozenset(
    {
        "KernelDeadlock",
        "ReadonlyFilesystem",
        "XfsShutdown",
        "CperHardwareErrorFatal",
        "CorruptDockerOverlay2",
        "FrequentKubeletRestart",
        "FrequentDockerRestart",
        "FrequentContainerdRestart",
        "ContainerRuntimeUnhealthy",
    }
)
# Conditions whose True means healthy: never evidence against a node.
HEALTHY_CONDITIONS: Final = frozenset({"Ready"})


class ConfigError(ValueError):
    """A configuration value that cannot be used; `variable` names where it came from."""

    def __init__(self, variable: str, problem: str) -> None:
        super().__init__(f"{variable}: {problem}")
        self.variable = variable
        self.problem = problem


@dataclass(frozen=True)
class Config:
    waiting_reasons: frozenset[str] = DEFAULT_WAITING_REASONS
    termination_reasons: frozenset[str] = DEFAULT_TERMINATION_REASONS
    failed_pod_reasons: frozenset[str] = DEFAULT_FAILED_POD_REASONS
    # CrashLoopBackOff counts once a container has restarted this often: a single crash is
    # usually the application, repeated crashes on one node may be the node.
    crashloop_restart_threshold: int = 3
    excluded_namespaces: frozenset[str] = DEFAULT_EXCLUDED_NAMESPACES
    # The namespace the project runs in; always excluded, whatever excluded_namespaces says.
    namespace: str = DEFAULT_NAMESPACE
    # A container that ran this long before crashing starts a new series: its earlier restarts
    # say nothing about today. The kubelet forgets its back-off on the same horizon (twice the
    # 5-minute maximum).
    crashloop_recent_run: timedelta = timedelta(minutes=10)
    # The pace a series of crashes is credited at: no faster than a kubelet with the default
    # crash-loop back-off (10 s doubling) restarts a container. A node may back off less
    # (KubeletCrashLoopBackOffMax, from 1 s, on by default since v1.35), and 3 crashes in 3
    # seconds there are not yet 3 in a row by the meaning the thresholds have everywhere else.
    # Only a compressed clock (the local cluster's fake kubelet) has reason to change it.
    crashloop_pace: timedelta = timedelta(seconds=10)
    # The waiting reasons above (a failed pull, a container the runtime cannot create or run)
    # count only once the kubelet has kept failing for this long: about three attempts with
    # its back-off of 10s, 20s, 40s. One failed attempt is too little evidence against a node.
    waiting_failure_after: timedelta = timedelta(seconds=30)
    reset_after: timedelta = timedelta(minutes=30)
    # A pod bound to a node whose sandbox never came up (PodReadyToStartContainers not True)
    # for this long is stuck on that node.
    pending_stuck_after: timedelta = timedelta(minutes=10)
    # A pod whose sandbox is up but whose containers are still being created (an image pull in
    # progress, say) is stuck only after this much longer: a multi-GB image takes minutes to
    # pull anywhere. Per workload: the `kn-rescheduler.io/stuck-after` annotation.
    pull_stuck_after: timedelta = timedelta(hours=1)
    # Let detect-failures forward failing pods the webhook never stamped (created before it
    # was installed, or while it was down); update-annotations then reads the owner's policy.
    forward_unstamped: bool = False
    # Also write kse.com/scheduled-hosts, for clusters still running the original plugin.
    kse_compat: bool = False
    # Move pods with the Eviction API (honours PodDisruptionBudgets) instead of a delete.
    use_eviction: bool = False
    dry_run: bool = False
    # The functions a PingSource drives (sweep-failures, assess-nodes' review, label-nodes,
    # annotate-usage, rebalance-nodes) start at most one full run per this interval in a
    # process: a tick sooner than that (anyone can post one to the Service) is answered 202
    # and logged (shared.platform.ticks). 0 turns the bound off (the local tests tick on demand).
    min_tick_interval: timedelta = timedelta(seconds=10)
    # "require": every event must come with an OIDC token Knative Eventing issued to one of
    # kn-rescheduler's ServiceAccounts for this function's audience (shared.platform.senders;
    # Eventing's authentication-oidc feature on, the sender-authentication component). "off":
    # anyone who reaches the Service may post.
    sender_auth: str = "off"
    api_timeout: timedelta = timedelta(seconds=2)
    handled_uids_max: int = 64
    max_retries: int = MAX_RETRIES

    # --- node health (assess-nodes, the webhook, the fast path) ---------------------------------
    # A node where this many distinct workloads failed within suspect_window turns suspect.
    suspect_workloads: int = 2
    # Failures older than this are forgotten; a suspect node with none newer is cleared.
    suspect_window: timedelta = timedelta(minutes=10)
    # Never more than this share of the schedulable nodes suspect at once.
    suspect_max_share: float = 0.3
    # Also taint a suspect node PreferNoSchedule (the label alone steers only opted-in pods).
    suspect_taint: bool = True
    # Weight of a preferred node affinity away from suspect nodes on opted-in pods; 0 (the
    # default): none. Measured (dev/bench/RESULTS.md): the taint alone gives one move per
    # recovery, and a term every healthy node matches dilutes the pod's own preferences even
    # when no node is suspect (the scheduler normalizes NodeAffinity scores by their maximum).
    suspect_affinity_weight: int = 0
    # Weight of a preferred node affinity a replacement gets away from nodes where other
    # workloads failed within suspect_window (the failing-workloads label), while at least one
    # such node is not among its own exclusions: a failure spreading over several nodes at once
    # (a burst) is seen before assess-nodes has the second workload that marks a node. 0: none.
    failing_affinity_weight: int = 100
    # Mark a node (the moved-off label, shared.api.movedoff) the moment a pod is moved off it
    # for a failure counted against the node, so that preference steers replacements in a burst
    # before assess-nodes has written its label; a mark steers for moved_off_window.
    moved_off_mark: bool = True
    moved_off_window: timedelta = timedelta(minutes=2)
    # Move a pod failing on a suspect node at its first node-fixable failure.
    suspect_fast_path: bool = True
    # Move a pod sooner than the thresholds above when what is beside it says its node is why
    # (shared/workloads/fastpath.py): another workload failing on the same node now, or a pod
    # of the same ReplicaSet Ready on another node. Then this many restarts in a row, or a
    # pull or start failing this long, are enough. 1 restart in a row is the container's second
    # failure (the kubelet restarts it at once after its first): measured with a real kubelet's
    # back-off, p95 17 s from the first failure to Ready elsewhere, against 29 s with 2 and
    # 53 s without (dev/bench/RESULTS.md).
    corroborated_fast_path: bool = True
    corroborated_restart_threshold: int = 1
    corroborated_waiting_after: timedelta = timedelta(seconds=10)
    # Node conditions that, while True, make the node suspect with no pod failing there (under
    # the same cap and opt-out); empty: conditions are no evidence.
    suspect_conditions: frozenset[str] = DEFAULT_SUSPECT_CONDITIONS

    # --- load-aware placement (score-nodes) -----------------------------------------------------
    # Keep a watch-fed cache of Nodes in score-nodes, for schedulers configured with
    # nodeCacheCapable: true (names only in each call). Off: no API access; names-only calls
    # then pass every node.
    extender_node_cache: bool = True

    # --- node pressure (label-nodes) -------------------------------------------------------------
    # The Prometheus HTTP API label-nodes queries, e.g. http://prometheus.monitoring:9090.
    prometheus_url: str = ""
    # The rule file (YAML); empty: the built-in default rules.
    pressure_rules_file: str = ""
    # The label a node under pressure gets, as key=value (the seed's spelling by default).
    pressure_label: str = f"{PRESSURE_LABEL_KEY}={PRESSURE_LABEL_VALUE}"
    # Weight of the preferred node affinity away from pressured nodes; 0: none.
    pressure_affinity_weight: int = 20
    # Never more than this share of the schedulable nodes labelled at once.
    pressure_max_share: float = 0.3
    # Prometheus unreachable or failing: labels are kept this long after the last good
    # evaluation, then removed (soft affinity never blocks scheduling; stale labels mislead).
    pressure_stale_after: timedelta = timedelta(minutes=5)

    # --- load-aware placement (annotate-usage, score-nodes) ---------------------------------
    # Where annotate-usage reads node usage: "prometheus" (prometheus_url) or "metrics-api"
    # (metrics.k8s.io, what metrics-server serves).
    # A preset of the settings below (shared.platform.profiles): default, production,
    # development, hpc, memory, microservices, multitenant. Explicit settings win over it.
    profile: str = DEFAULT_PROFILE
    usage_source: str = USAGE_SOURCE_PROMETHEUS
    # Prometheus source: the current CPU usage is a rate over this window (at least 4 scrape
    # intervals; the 5-minute average and 1-hour maximum have their own windows).
    usage_rate_window: timedelta = timedelta(minutes=1)
    # A Node's usage annotation is rewritten only when a value moved by more than this many
    # percentage points (or the estimate or the bucket changed, or the record is getting stale).
    usage_tolerance: float = 2.0
    # Usage sampled longer ago than this is no usage: the extender neither filters nor penalises
    # the node, and its load label is removed.
    usage_stale_after: timedelta = timedelta(minutes=3)
    # Pods bound to a node within this long before a sample count as estimated usage (their
    # requests times usage_estimate_factor): their load does not show in the usage yet.
    usage_estimate_window: timedelta = timedelta(minutes=1)
    usage_estimate_factor: float = 1.0
    # Filter: a node whose CPU or memory usage is above these (percent) is failed by the extender.
    cpu_threshold: float = 80.0
    memory_threshold: float = 80.0
    # Filter: a node whose usage plus the pod's requests would exceed this (percent) is failed.
    predicted_usage_limit: float = 95.0
    # Prioritize: (100 - cpu) * cpu_score_weight + (100 - memory) * memory_score_weight, plus
    # load_balance_bonus when both are under low_load_threshold, scaled to the extender's range.
    cpu_score_weight: float = 0.5
    memory_score_weight: float = 0.5
    load_balance_bonus: float = 10.0
    # Load buckets (label mode): low under low_load_threshold, medium under high_load_threshold,
    # high under the CPU/memory threshold, overloaded above it or in maintenance; a node leaves a
    # bucket downwards only load_hysteresis points below its boundary.
    low_load_threshold: float = 30.0
    high_load_threshold: float = 60.0
    load_hysteresis: float = 5.0
    # Weight of the preferred affinities the webhook injects on the load label; 0: none.
    load_affinity_weight: int = 30

    # --- rebalancing (rebalance-nodes) -----------------------------------------------------------
    # A node is hot when its measured CPU or memory usage is over cpu_threshold /
    # memory_threshold, or over the mean of the schedulable, Ready nodes with fresh usage by more
    # than rebalance_gap points (100: the mean rule is off); it is acted on only after this many
    # hot samples in a row (usage records with a new sample time, however often they are read).
    # A node in maintenance needs no streak.
    rebalance_hot_samples: int = 3
    rebalance_gap: float = 20.0
    # At most this many evictions per evaluation, per node, per namespace and per workload.
    rebalance_max_per_run: int = 5
    rebalance_max_per_node: int = 2
    rebalance_max_per_namespace: int = 3
    rebalance_max_per_workload: int = 1
    # Never evict a pod when fewer than this share of its workload's desired replicas would stay
    # ready (rounded up): 0.5 of 3 keeps 2, and a single replica is never evicted unless 0.
    rebalance_min_available: float = 0.5
    # Also evict pods whose replacements the stock scheduler places by requests alone (no
    # kn-rescheduler-load-aware schedulerName, no load-label affinity) off an uncordoned node.
    # Turn on when the default scheduler calls score-nodes (knative/scheduler/); otherwise the
    # replacement tends to land back on the hot node (dev/bench/RESULTS.md, section 9).
    rebalance_any_placement: bool = False

    def __post_init__(self) -> None:
        for name in ("waiting_reasons", "termination_reasons"):
            _refuse_never_move(getattr(self, name), name)

    @property
    def api_timeout_seconds(self) -> float:
        return self.api_timeout.total_seconds()

    def is_excluded_namespace(self, namespace: str | None) -> bool:
        return namespace in self.excluded_namespaces or namespace == self.namespace

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str],
        file: Path | None = None,
        *,
        reads: Collection[str] | None = None,
    ) -> Config:
        """Build the config from a mounted file (optional) overlaid by the environment.

        `file` defaults to the path in KN_RESCHEDULER_CONFIG_FILE when that is set. Unknown
        keys in the file are errors (they are typos); unknown KN_RESCHEDULER_* variables are
        ignored, since functions define their own.

        With `reads`, only those settings are read and checked; every other one keeps its
        default, whatever the environment or the file says (`for_function`).
        """
        wanted = frozenset(_FIELDS) if reads is None else frozenset(reads)
        if file is None and environ.get(CONFIG_FILE_ENV):
            file = Path(environ[CONFIG_FILE_ENV])
        values: dict[str, Any] = {}
        if file is not None:
            for key, raw in _read_file(file).items():
                if key in wanted:
                    values[key] = _convert(key, raw, f"{key} in {file.name}")
        for name in _FIELDS:
            variable = ENV_PREFIX + name.upper()
            if name in wanted and variable in environ:
                values[name] = _convert(name, environ[variable], variable)
        # The profile's preset under everything given explicitly.
        preset = PROFILES[values.get("profile", DEFAULT_PROFILE)].values
        values = {**{k: v for k, v in preset.items() if k in wanted}, **values}
        try:
            config = cls(**values)
        except ConfigError:
            raise
        except (TypeError, ValueError) as err:  # pragma: no cover - conversions check types
            raise ConfigError("config", str(err)) from err
        for check in _CHECKS:
            if check.fields <= wanted:
                check.run(config)
        return config

    @classmethod
    def for_function(
        cls, function: str, environ: Mapping[str, str], file: Path | None = None
    ) -> Config:
        """The settings `function` reads (shared.platform.reads, generated from its code), from
        the environment and the file as `from_env` reads them. Every other setting keeps its
        default: a value there, good or bad, is another function's, so a typo in a rebalancing
        limit cannot stop the webhook from starting."""
        if function not in READS:
            raise ConfigError("function", f"no function {function!r}: {', '.join(READS)}")
        return cls.from_env(environ, file, reads=READS[function])


@dataclass(frozen=True)
class _Check:
    """A rule over several settings, checked only where a function reads all of them: a
    function that reads the CPU threshold but not the load buckets has no use for their order."""

    fields: frozenset[str]
    holds: Callable[[Config], bool]
    variable: str
    problem: Callable[[Config], str]

    def run(self, config: Config) -> None:
        if not self.holds(config):
            raise ConfigError(self.variable, self.problem(config))


_CHECKS: Final = (
    _Check(
        frozenset(
            {"low_load_threshold", "high_load_threshold", "cpu_threshold", "memory_threshold"}
        ),
        lambda c: (
            c.low_load_threshold < c.high_load_threshold <= min(c.cpu_threshold, c.memory_threshold)
        ),
        "KN_RESCHEDULER_HIGH_LOAD_THRESHOLD",
        lambda c: (
            "expected low_load_threshold < high_load_threshold <= cpu_threshold and "
            f"memory_threshold, got {c.low_load_threshold}, {c.high_load_threshold}, "
            f"{c.cpu_threshold}, {c.memory_threshold}"
        ),
    ),
    _Check(
        frozenset({"rebalance_gap"}),
        lambda c: c.rebalance_gap > 0,
        "KN_RESCHEDULER_REBALANCE_GAP",
        lambda c: (
            f"expected a gap above 0 points (100 turns the mean rule off), got {c.rebalance_gap}"
        ),
    ),
    _Check(
        frozenset({"cpu_score_weight", "memory_score_weight"}),
        lambda c: c.cpu_score_weight + c.memory_score_weight > 0,
        "KN_RESCHEDULER_CPU_SCORE_WEIGHT",
        lambda c: "cpu_score_weight and memory_score_weight cannot both be 0",
    ),
)


def _read_file(file: Path) -> dict[str, Any]:
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(CONFIG_FILE_ENV, f"cannot read {file}: {err.strerror}") from err
    try:
        # YAML is a superset of JSON, so one parser serves both.
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(CONFIG_FILE_ENV, f"{file.name} is not valid YAML or JSON") from err
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(CONFIG_FILE_ENV, f"{file.name} must hold a mapping of settings")
    unknown = sorted(str(key) for key in loaded if key not in _FIELDS)
    if unknown:
        raise ConfigError(
            CONFIG_FILE_ENV,
            f"unknown setting(s) {', '.join(unknown)} in {file.name}; "
            f"known: {', '.join(sorted(_FIELDS))}",
        )
    return {str(key): value for key, value in loaded.items()}


def _as_str_set(raw: object, where: str) -> frozenset[str]:
    if isinstance(raw, str):
        items = [item.strip() for item in raw.split(",")]
    elif isinstance(raw, list) and all(isinstance(item, str) for item in raw):
        items = [item.strip() for item in raw]
    else:
        raise ConfigError(where, f"expected a comma-separated list of names, got {raw!r}")
    return frozenset(item for item in items if item)


_TRUE: Final = frozenset({"true", "1", "yes", "on"})
_FALSE: Final = frozenset({"false", "0", "no", "off", ""})


def _as_bool(raw: object, where: str) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str):
        lowered = raw.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
    raise ConfigError(where, f"expected true or false, got {raw!r}")


def _as_positive_int(raw: object, where: str) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, str) and raw.strip().isascii() and raw.strip().isdigit():
        value = int(raw.strip())
    else:
        raise ConfigError(where, f"expected a positive whole number, got {raw!r}")
    if value < 1:
        raise ConfigError(where, f"expected a positive whole number, got {raw!r}")
    return value


def _as_duration(raw: object, where: str) -> timedelta:
    if not isinstance(raw, str):
        raise ConfigError(where, f"expected a duration such as 90s, 30m or 1h30m, got {raw!r}")
    try:
        duration = parse_duration(raw.strip())
    except ValueError as err:
        raise ConfigError(where, str(err)) from err
    if duration <= timedelta(0):
        raise ConfigError(where, f"expected a positive duration, got {raw!r}")
    return duration


def _as_interval(raw: object, where: str) -> timedelta:
    """A duration that may be zero ("0s": no bound)."""
    if isinstance(raw, str) and raw.strip() in ("0", "0s"):
        return timedelta(0)
    return _as_duration(raw, where)


SENDER_AUTH_CHOICES: Final = ("off", "require")


def _as_sender_auth(raw: object, where: str) -> str:
    text = raw.strip().lower() if isinstance(raw, str) else raw
    if text not in SENDER_AUTH_CHOICES:
        raise ConfigError(where, f"expected one of {', '.join(SENDER_AUTH_CHOICES)}, got {raw!r}")
    return str(text)


def _as_name(raw: object, where: str) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise ConfigError(where, f"expected a non-empty name, got {raw!r}")
    return raw.strip()


def _refuse_never_move(reasons: frozenset[str], where: str) -> None:
    never = reasons & NEVER_MOVE_REASONS
    if never:
        raise ConfigError(
            where, f"{', '.join(sorted(never))} fail on every node; moving the pod cannot help"
        )


def _as_conditions(raw: object, where: str) -> frozenset[str]:
    types = _as_str_set(raw, where)
    healthy = types & HEALTHY_CONDITIONS
    if healthy:
        raise ConfigError(
            where,
            f"{', '.join(sorted(healthy))} is True on a healthy node: no evidence of a problem",
        )
    return types


def _as_reasons(raw: object, where: str) -> frozenset[str]:
    reasons = _as_str_set(raw, where)
    _refuse_never_move(reasons, where)
    return reasons


def _as_max_retries(raw: object, where: str) -> int:
    value = _as_positive_int(raw, where)
    if value > 10_000:
        raise ConfigError(where, f"at most 10000, got {raw!r}")
    return value


def _as_share(raw: object, where: str) -> float:
    """A share of the nodes: 0.3 or "30%"; more than 0, at most 1."""
    value: float
    try:
        if isinstance(raw, bool):
            raise TypeError
        if isinstance(raw, int | float):
            value = float(raw)
        elif isinstance(raw, str) and raw.strip().endswith("%"):
            value = float(raw.strip()[:-1]) / 100
        elif isinstance(raw, str):
            value = float(raw.strip())
        else:
            raise TypeError
    except (TypeError, ValueError) as err:
        raise ConfigError(where, f"expected a share such as 0.3 or 30%, got {raw!r}") from err
    if not 0 < value <= 1:
        raise ConfigError(where, f"expected a share above 0 and at most 1 (100%), got {raw!r}")
    return value


def _as_weight(raw: object, where: str) -> int:
    """A preferred-affinity weight: 1..100 as the API accepts, 0 to add none."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, str) and raw.strip().isascii() and raw.strip().isdigit():
        value = int(raw.strip())
    else:
        raise ConfigError(where, f"expected a weight from 0 to 100, got {raw!r}")
    if not 0 <= value <= 100:
        raise ConfigError(where, f"expected a weight from 0 to 100, got {raw!r}")
    return value


def _as_text(raw: object, where: str) -> str:
    if not isinstance(raw, str):
        raise ConfigError(where, f"expected a string, got {raw!r}")
    return raw.strip()


def _as_label(raw: object, where: str) -> str:
    """A label as key=value, both non-empty."""
    text = _as_text(raw, where)
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise ConfigError(where, f"expected a label as key=value, got {raw!r}")
    return f"{key.strip()}={value.strip()}"


def _as_number(raw: object, where: str, expected: str) -> float:
    try:
        if isinstance(raw, bool):
            raise TypeError
        if isinstance(raw, int | float):
            value = float(raw)
        elif isinstance(raw, str):
            value = float(raw.strip().removesuffix("%"))
        else:
            raise TypeError
    except (TypeError, ValueError) as err:
        raise ConfigError(where, f"expected {expected}, got {raw!r}") from err
    if math.isnan(value) or math.isinf(value):
        raise ConfigError(where, f"expected {expected}, got {raw!r}")
    return value


def _as_percent(raw: object, where: str) -> float:
    """Percentage points, 0..100: 80, 80.5 or "80%"."""
    value = _as_number(raw, where, "a percentage from 0 to 100 such as 80 or 80%")
    if not 0 <= value <= 100:
        raise ConfigError(where, f"expected a percentage from 0 to 100, got {raw!r}")
    return value


def _as_factor(raw: object, where: str) -> float:
    """A multiplier from 0 to 10 (a weight, a share of requests)."""
    value = _as_number(raw, where, "a number from 0 to 10 such as 0.5")
    if not 0 <= value <= 10:
        raise ConfigError(where, f"expected a number from 0 to 10, got {raw!r}")
    return value


def _as_fraction(raw: object, where: str) -> float:
    """A share from 0 to 1 inclusive: 0.5 or "50%" (0 allowed, unlike a share of nodes)."""
    if isinstance(raw, str) and raw.strip().endswith("%"):
        value = _as_number(raw, where, "a share from 0 to 1 such as 0.5 or 50%") / 100
    else:
        value = _as_number(raw, where, "a share from 0 to 1 such as 0.5 or 50%")
    if not 0 <= value <= 1:
        raise ConfigError(where, f"expected a share from 0 to 1 (100%), got {raw!r}")
    return value


def _as_profile(raw: object, where: str) -> str:
    text = _as_text(raw, where)
    if text not in PROFILES:
        raise ConfigError(where, f"unknown profile {raw!r}; profiles: {', '.join(PROFILES)}")
    return text


def _as_usage_source(raw: object, where: str) -> str:
    text = _as_text(raw, where)
    if text not in USAGE_SOURCES:
        raise ConfigError(where, f"expected one of {', '.join(USAGE_SOURCES)}, got {raw!r}")
    return text


# Every Config field and how to read it from a string (env) or a YAML value (file).
_FIELDS: Final[dict[str, Callable[[object, str], Any]]] = {
    "waiting_reasons": _as_reasons,
    "termination_reasons": _as_reasons,
    "failed_pod_reasons": _as_str_set,
    "crashloop_restart_threshold": _as_positive_int,
    "excluded_namespaces": _as_str_set,
    "namespace": _as_name,
    "crashloop_recent_run": _as_duration,
    "crashloop_pace": _as_duration,
    "min_tick_interval": _as_interval,
    "sender_auth": _as_sender_auth,
    "waiting_failure_after": _as_duration,
    "reset_after": _as_duration,
    "pending_stuck_after": _as_duration,
    "pull_stuck_after": _as_duration,
    "forward_unstamped": _as_bool,
    "kse_compat": _as_bool,
    "use_eviction": _as_bool,
    "extender_node_cache": _as_bool,
    "dry_run": _as_bool,
    "api_timeout": _as_duration,
    "handled_uids_max": _as_positive_int,
    "max_retries": _as_max_retries,
    "suspect_workloads": _as_positive_int,
    "suspect_window": _as_duration,
    "suspect_max_share": _as_share,
    "suspect_taint": _as_bool,
    "suspect_affinity_weight": _as_weight,
    "failing_affinity_weight": _as_weight,
    "moved_off_mark": _as_bool,
    "moved_off_window": _as_duration,
    "suspect_fast_path": _as_bool,
    "corroborated_fast_path": _as_bool,
    "corroborated_restart_threshold": _as_positive_int,
    "corroborated_waiting_after": _as_duration,
    "suspect_conditions": _as_conditions,
    "prometheus_url": _as_text,
    "pressure_rules_file": _as_text,
    "pressure_label": _as_label,
    "pressure_affinity_weight": _as_weight,
    "pressure_max_share": _as_share,
    "pressure_stale_after": _as_duration,
    "profile": _as_profile,
    "usage_source": _as_usage_source,
    "usage_rate_window": _as_duration,
    "usage_tolerance": _as_percent,
    "usage_stale_after": _as_duration,
    "usage_estimate_window": _as_duration,
    "usage_estimate_factor": _as_factor,
    "cpu_threshold": _as_percent,
    "memory_threshold": _as_percent,
    "predicted_usage_limit": _as_percent,
    "cpu_score_weight": _as_factor,
    "memory_score_weight": _as_factor,
    "load_balance_bonus": _as_percent,
    "low_load_threshold": _as_percent,
    "high_load_threshold": _as_percent,
    "load_hysteresis": _as_percent,
    "load_affinity_weight": _as_weight,
    "rebalance_hot_samples": _as_positive_int,
    "rebalance_gap": _as_percent,
    "rebalance_max_per_run": _as_positive_int,
    "rebalance_max_per_node": _as_positive_int,
    "rebalance_max_per_namespace": _as_positive_int,
    "rebalance_max_per_workload": _as_positive_int,
    "rebalance_min_available": _as_fraction,
    "rebalance_any_placement": _as_bool,
}


def _convert(name: str, raw: object, where: str) -> Any:
    return _FIELDS[name](raw, where)


def describe(config: Config, function: str | None = None) -> str:
    """One log line with every setting, or with the ones `function` reads, for start-up logs."""
    reads = READS.get(function, frozenset()) if function is not None else None
    shown: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        if reads is not None and f.name not in reads:
            continue
        value = getattr(config, f.name)
        if isinstance(value, frozenset):
            value = sorted(value)
        elif isinstance(value, timedelta):
            value = value.total_seconds()
        shown[f.name] = value
    return json.dumps(shown, sort_keys=True)
