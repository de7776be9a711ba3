"""Presets of the load-aware settings, one per kind of cluster, chosen by one setting.

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
        "Balanced: a node is hot over 80 % of either resource, a placement may take it to 95 %.",
        {
            "cpu_threshold": 80.0,
            "memory_threshold": 80.0,
            "predicted_usage_limit": 95.0,
            "cpu_score_weight": 0.5,
            "memory_score_weight": 0.5,
            "load_balance_bonus": 10.0,
        },
    ),
    Profile(
        "production",
        "Headroom for spikes and failover: hot at 70 % CPU / 75 % memory, placements stop at "
        "90 %, a quiet node must stay quiet longer before its bucket falls.",
        {
            "cpu_threshold": 70.0,
            "memory_threshold": 75.0,
            "predicted_usage_limit": 90.0,
            "cpu_score_weight": 0.5,
            "memory_score_weight": 0.5,
            "load_balance_bonus": 10.0,
            "load_hysteresis": 8.0,
        },
    ),
    Profile(
        "development",
        "Pack small clusters: hot only at 90 %, placements up to 98 %, no low-load bonus "
        "(spreading buys nothing when nobody measures latency).",
        {
            "cpu_threshold": 90.0,
            "memory_threshold": 90.0,
            "predicted_usage_limit": 98.0,
            "cpu_score_weight": 0.5,
            "memory_score_weight": 0.5,
            "load_balance_bonus": 0.0,
        },
    ),
    Profile(
        "hpc",
        "CPU-bound batch: the score follows free CPU (0.8) over memory (0.2); a busy CPU slows "
        "every job on the node, so hot at 85 % CPU; no bonus, jobs fill nodes.",
        {
            "cpu_threshold": 85.0,
            "memory_threshold": 85.0,
            "predicted_usage_limit": 95.0,
            "cpu_score_weight": 0.8,
            "memory_score_weight": 0.2,
            "load_balance_bonus": 0.0,
        },
    ),
    Profile(
        "memory",
        "Memory-bound (caches, JVMs, analytics): memory decides the score (0.8) and a node is "
        "hot at 70 % memory, before the kubelet's eviction threshold; CPU at 85 %.",
        {
            "cpu_threshold": 85.0,
            "memory_threshold": 70.0,
            "predicted_usage_limit": 90.0,
            "cpu_score_weight": 0.2,
            "memory_score_weight": 0.8,
            "load_balance_bonus": 10.0,
        },
    ),
    Profile(
        "microservices",
        "Many small latency-sensitive pods: spread them (a bonus of 20 for nodes under 30 %), "
        "hot at 70 %, placements stop at 90 %.",
        {
            "cpu_threshold": 70.0,
            "memory_threshold": 70.0,
            "predicted_usage_limit": 90.0,
            "cpu_score_weight": 0.5,
            "memory_score_weight": 0.5,
            "load_balance_bonus": 20.0,
        },
    ),
    Profile(
        "multitenant",
        "Noisy neighbours: hot at 75 %, placements stop at 90 %, a bonus of 15 keeps tenants "
        "apart on quiet nodes.",
        {
            "cpu_threshold": 75.0,
            "memory_threshold": 75.0,
            "predicted_usage_limit": 90.0,
            "cpu_score_weight": 0.5,
            "memory_score_weight": 0.5,
            "load_balance_bonus": 15.0,
        },
    ),
)

PROFILES: Final[Mapping[str, Profile]] = {profile.name: profile for profile in _PROFILES}
DEFAULT_PROFILE: Final = "default"
