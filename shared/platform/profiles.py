"""Presets of the load-aware and rebalancing settings, one per kind of cluster, by one setting.

``KN_RESCHEDULER_PROFILE=production`` (or ``profile: production`` in the config file) starts
from that row; any setting given explicitly, in the file or the environment, wins over it. The
seven names are the seed's; the values are ours, each with its reason (docs/load-aware.md shows
the table). A profile only sets what it names; everything else keeps its default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final


@dataclass(frozen=True)
class Profile:
    name: str
    why: str
    values: Mapping[str, Any]


_PROFILES: Final = (
    Profile(
        "default",
        "Balanced: a node is hot over 80 % of either resource, a placement may take it to 95 %; "
        "rebalancing acts after 3 hot evaluations, at most 5 evictions a run, 2 per node, 1 per "
        "workload, and keeps half of a workload's replicas ready.",
        {
            "cpu_threshold": 80.0,
            "memory_threshold": 80.0,
            "predicted_usage_limit": 95.0,
            "cpu_score_weight": 0.5,
            "memory_score_weight": 0.5,
            "load_balance_bonus": 10.0,
            "rebalance_hot_samples": 3,
            "rebalance_gap": 20.0,
            "rebalance_max_per_run": 5,
            "rebalance_max_per_node": 2,
            "rebalance_max_per_namespace": 3,
            "rebalance_max_per_workload": 1,
            "rebalance_min_available": 0.5,
        },
    ),
    Profile(
        "production",
        "Headroom for spikes and failover: hot at 70 % CPU / 75 % memory, placements stop at "
        "90 %, a quiet node must stay quiet longer before its bucket falls; rebalancing waits "
        "for 5 hot evaluations, moves at most 3 pods a run and 1 per node, and keeps 75 % of a "
        "workload ready.",
        {
            "cpu_threshold": 70.0,
            "memory_threshold": 75.0,
            "predicted_usage_limit": 90.0,
            "cpu_score_weight": 0.5,
            "memory_score_weight": 0.5,
            "load_balance_bonus": 10.0,
            "load_hysteresis": 8.0,
            "rebalance_hot_samples": 5,
            "rebalance_gap": 25.0,
            "rebalance_max_per_run": 3,
            "rebalance_max_per_node": 1,
            "rebalance_max_per_namespace": 2,
            "rebalance_max_per_workload": 1,
            "rebalance_min_available": 0.75,
        },
    ),
    Profile(
        "development",
        "Pack small clusters: hot only at 90 %, placements up to 98 %, no low-load bonus "
        "(spreading buys nothing when nobody measures latency); rebalancing acts after 2 hot "
        "evaluations and moves up to 10 pods a run.",
        {
            "cpu_threshold": 90.0,
            "memory_threshold": 90.0,
            "predicted_usage_limit": 98.0,
            "cpu_score_weight": 0.5,
            "memory_score_weight": 0.5,
            "load_balance_bonus": 0.0,
            "rebalance_hot_samples": 2,
            "rebalance_gap": 30.0,
            "rebalance_max_per_run": 10,
            "rebalance_max_per_node": 5,
            "rebalance_max_per_namespace": 10,
            "rebalance_max_per_workload": 2,
            "rebalance_min_available": 0.5,
        },
    ),
    Profile(
        "hpc",
        "CPU-bound batch: the score follows free CPU (0.8) over memory (0.2); a busy CPU slows "
        "every job on the node, so hot at 85 % CPU; no bonus, jobs fill nodes; rebalancing waits "
        "for 5 hot evaluations and moves at most 2 pods a run (an evicted job loses its work).",
        {
            "cpu_threshold": 85.0,
            "memory_threshold": 85.0,
            "predicted_usage_limit": 95.0,
            "cpu_score_weight": 0.8,
            "memory_score_weight": 0.2,
            "load_balance_bonus": 0.0,
            "rebalance_hot_samples": 5,
            "rebalance_gap": 30.0,
            "rebalance_max_per_run": 2,
            "rebalance_max_per_node": 1,
            "rebalance_max_per_namespace": 2,
            "rebalance_max_per_workload": 1,
            "rebalance_min_available": 0.5,
        },
    ),
    Profile(
        "memory",
        "Memory-bound (caches, JVMs, analytics): memory decides the score (0.8) and a node is "
        "hot at 70 % memory, before the kubelet's eviction threshold; CPU at 85 %; a gap of 15 "
        "points over the mean is hot too (memory does not free itself).",
        {
            "cpu_threshold": 85.0,
            "memory_threshold": 70.0,
            "predicted_usage_limit": 90.0,
            "cpu_score_weight": 0.2,
            "memory_score_weight": 0.8,
            "load_balance_bonus": 10.0,
            "rebalance_hot_samples": 3,
            "rebalance_gap": 15.0,
            "rebalance_max_per_run": 5,
            "rebalance_max_per_node": 2,
            "rebalance_max_per_namespace": 3,
            "rebalance_max_per_workload": 1,
            "rebalance_min_available": 0.5,
        },
    ),
    Profile(
        "microservices",
        "Many small latency-sensitive pods: spread them (a bonus of 20 for nodes under 30 %), "
        "hot at 70 %, placements stop at 90 %; small pods move cheaply: up to 10 a run, 2 per "
        "workload, while 75 % of its replicas stay ready.",
        {
            "cpu_threshold": 70.0,
            "memory_threshold": 70.0,
            "predicted_usage_limit": 90.0,
            "cpu_score_weight": 0.5,
            "memory_score_weight": 0.5,
            "load_balance_bonus": 20.0,
            "rebalance_hot_samples": 3,
            "rebalance_gap": 15.0,
            "rebalance_max_per_run": 10,
            "rebalance_max_per_node": 3,
            "rebalance_max_per_namespace": 5,
            "rebalance_max_per_workload": 2,
            "rebalance_min_available": 0.75,
        },
    ),
    Profile(
        "multitenant",
        "Noisy neighbours: hot at 75 %, placements stop at 90 %, a bonus of 15 keeps tenants "
        "apart on quiet nodes; rebalancing moves at most 1 pod per namespace a run, so no tenant "
        "pays for the others' load.",
        {
            "cpu_threshold": 75.0,
            "memory_threshold": 75.0,
            "predicted_usage_limit": 90.0,
            "cpu_score_weight": 0.5,
            "memory_score_weight": 0.5,
            "load_balance_bonus": 15.0,
            "rebalance_hot_samples": 3,
            "rebalance_gap": 20.0,
            "rebalance_max_per_run": 5,
            "rebalance_max_per_node": 2,
            "rebalance_max_per_namespace": 1,
            "rebalance_max_per_workload": 1,
            "rebalance_min_available": 0.5,
        },
    ),
)

PROFILES: Final[Mapping[str, Profile]] = {profile.name: profile for profile in _PROFILES}
DEFAULT_PROFILE: Final = "default"
