"""Every annotation key, label key, field key and event type the project reads or writes.

These names are contracts: users put the policy annotation on their workloads, Triggers filter
on the event types, and existing clusters carry the state annotation. Change none of them
without a migration.
"""

from collections.abc import Mapping
from typing import Final

# The user's opt-in, kept compatible with the original kse-rescheduler: an integer, 0 disables.
POLICY_ANNOTATION: Final = "scheduling-retries"

PREFIX: Final = "kn-rescheduler.io/"

# Versioned JSON state, on the pod's direct controller (ReplicaSet, StatefulSet, Job) or on a
# bare pod itself.
STATE_ANNOTATION: Final = PREFIX + "state"
# JSON list of node names the webhook stamped on a new pod; the scheduler is kept off them by a
# required node affinity added at the same time.
EXCLUDED_NODES_ANNOTATION: Final = PREFIX + "excluded-nodes"
# Per-workload override of how long a pod must have run before its failure no longer says
# anything about the nodes it was kept off (a Go-style duration such as "30m" or "2h").
RESET_AFTER_ANNOTATION: Final = PREFIX + "reset-after"
# Written by the webhook on pods it patched, so later functions know the pod is opted in. A key
# of ours, not the user's: a pod orphaned from its ReplicaSet (`kubectl delete rs
# --cascade=orphan`) keeps the stamp, and must not read it as a bare pod's own policy. A bare
# pod's policy is only ever its own `scheduling-retries`.
POLICY_STAMP_ANNOTATION: Final = PREFIX + "scheduling-retries"
# Per-workload override of how long a pod may stay bound to a node without starting before the
# sweep calls it stuck (a Go-style duration); the webhook copies it onto the pod.
STUCK_AFTER_ANNOTATION: Final = PREFIX + "stuck-after"
# Label on a pod or a Node that makes every function leave it alone (also the webhook's
# objectSelector). Its presence opts out, whatever its value ("", "true", even "false"): that is
# what the webhook's `DoesNotExist` selector sees, and every function reads it the same way
# through `opted_out`.
OPT_OUT_LABEL: Final = PREFIX + "ignore"


def opted_out(labels: Mapping[str, str] | None) -> bool:
    """Whether a pod or Node carries the opt-out label (any value): the one rule for both."""
    return OPT_OUT_LABEL in (labels or {})


# Compatibility with the original Podrescheduling scheduler plugin, written when enabled.
KSE_SCHEDULED_HOSTS_ANNOTATION: Final = "kse.com/scheduled-hosts"

# Event types Knative's ApiServerSource emits in Resource mode.
APISERVER_ADD: Final = "dev.knative.apiserver.resource.add"
APISERVER_UPDATE: Final = "dev.knative.apiserver.resource.update"
APISERVER_DELETE: Final = "dev.knative.apiserver.resource.delete"

# Event types the project emits.
EVENT_POD_FAILING: Final = "io.kn-rescheduler.pod.failing"
EVENT_POD_RESCHEDULED: Final = "io.kn-rescheduler.pod.rescheduled"
EVENT_POD_EXHAUSTED: Final = "io.kn-rescheduler.pod.exhausted"
EVENT_SOURCE_PREFIX: Final = "/kn-rescheduler/"

# Reasons of the Kubernetes Events recorded on workloads.
REASON_RESCHEDULED: Final = "Rescheduled"
REASON_EXCLUSIONS_CLEARED: Final = "ExclusionsCleared"
REASON_RETRIES_EXHAUSTED: Final = "RetriesExhausted"
# The workload fails the same way on every node it tried and no pod of it is healthy anywhere:
# moves stop (nothing charged) until one is, or its template changes.
REASON_MOVES_STOPPED: Final = "MovesStopped"
REASON_INVALID_POLICY: Final = "InvalidPolicy"
# The move was decided but a PodDisruptionBudget refuses the eviction for now; retried later.
REASON_MOVE_DEFERRED: Final = "MoveDeferred"
# The workload's state would outgrow its cap even after pruning; the pod is left in place.
REASON_STATE_TOO_LARGE: Final = "StateTooLarge"
# A replacement admitted before its predecessor's terminal failure was recorded, headed for the
# node that failed it, was deleted so that its owner recreates it avoiding that node.
REASON_REPLACEMENT_REDIRECTED: Final = "ReplacementRedirected"

# The component name on Kubernetes Events and the field manager on writes.
COMPONENT: Final = "kn-rescheduler"

# Namespace the project is installed in; its own pods are never touched.
DEFAULT_NAMESPACE: Final = "kn-rescheduler"

# A bare pod's move needs its replacement created, and update-annotations may not create pods
# in that namespace (bare-pod replacement is opt-in per namespace, granted by a RoleBinding).
REASON_REPLACEMENT_NOT_ALLOWED: Final = "ReplacementNotAllowed"
# The API server refuses the replacement of a bare pod for another reason (a quota, a
# LimitRange, an admission policy, validation); the move is not charged and is tried again.
REASON_REPLACEMENT_REFUSED: Final = "ReplacementRefused"

# Label the webhook sets on every pod it stamps with a policy (0 and unreadable values too),
# and removes from a pod whose owner has none (a copied template). The ApiServerSource selects
# on it (knative/sources.yaml), so pods that never opted in produce no event at all: the
# API server filters its watch, before the adapter or detect-failures spend anything on them.
# A label, not an annotation: only labels can be selected on.
OPTED_IN_LABEL: Final = PREFIX + "opted-in"
OPTED_IN_VALUE: Final = "true"

# Label the admission policies put on a ReplicaSet, StatefulSet or Job (at its create and each
# update) while it carries an annotation a new pod's admission reads (`scheduling-retries`,
# `avoid-pressure`, `load-aware`), and take off when it no longer does. The pod policies'
# bindings select their params (the pods' controllers) on it: the API server evaluates a
# policy once per selected param, so a namespace's other workloads cost its pod creates
# nothing (shared.admission.policies).
ADMISSION_PARAM_LABEL: Final = PREFIX + "admission-param"
ADMISSION_PARAM_VALUE: Final = "true"

# Per-workload opt-in, on a Job (its CronJob's jobTemplate copies it) or on a CronJob: at the
# Job's creation the webhook gives a Job with restartPolicy Never and no podFailurePolicy of its
# own the rule `Ignore` on the `DisruptionTarget` condition, so a move (an eviction) does not
# count against its backoffLimit. The field is immutable once the Job exists.
IGNORE_DISRUPTIONS_ANNOTATION: Final = PREFIX + "ignore-disruptions"
# A move would make the Job controller fail the Job (its backoffLimit, a per-index limit, or a
# FailJob rule of its pod failure policy): the pod is left where it is.
REASON_MOVE_WOULD_FAIL_JOB: Final = "MoveWouldFailJob"
# A move counted against the Job's backoffLimit used its last retry: one more failed pod, from
# any cause, fails the Job.
REASON_JOB_RETRIES_SPENT: Final = "JobRetriesSpent"

# Kubernetes' own names that the Job logic reads (pkg/controller/job, k8s.io/api/batch/v1).
# The finalizer the Job controller keeps on its pods until it has counted them.
JOB_TRACKING_FINALIZER: Final = "batch.kubernetes.io/job-tracking"
# The label the Job controller puts on its pods (and selects them by): the Job's uid.
JOB_CONTROLLER_UID_LABEL: Final = "batch.kubernetes.io/controller-uid"
# On an Indexed Job's pod (backoffLimitPerIndex): the failures counted for its index so far.
JOB_INDEX_FAILURE_COUNT_ANNOTATION: Final = "batch.kubernetes.io/job-index-failure-count"
# The kubelet sets this on the API mirror of a static pod; deleting a mirror does not stop the
# static pod, the kubelet just recreates the mirror.
MIRROR_POD_ANNOTATION: Final = "kubernetes.io/config.mirror"
# The pod condition the Eviction API sets (reason EvictionByEvictionAPI) before deleting.
DISRUPTION_TARGET_CONDITION: Final = "DisruptionTarget"

# The only field a node selector can match on: the webhook keeps a pod off a node with a
# matchFields term on it, and a replacement's body drops exactly those terms.
NODE_NAME_FIELD: Final = "metadata.name"

# --- Node health (assess-nodes): failures blamed on nodes -------------------------------------
# Versioned JSON record on the Node: the recent failures seen there (workload, reason, time),
# whether the node is suspect and since when. Written with a resourceVersion compare-and-swap,
# like the workload state.
NODE_HEALTH_ANNOTATION: Final = PREFIX + "node-health"
# Label and PreferNoSchedule taint (same key, value "true") on a node where several distinct
# workloads failed recently. Blame never adds a NoSchedule or NoExecute taint.
SUSPECT_LABEL: Final = PREFIX + "suspect"
SUSPECT_VALUE: Final = "true"
SUSPECT_TAINT_EFFECT: Final = "PreferNoSchedule"
# Label on a node where at least one workload failed within the suspect window, its value the
# number of distinct workloads ("1", "2", ...): written with the record, removed when it empties.
# Not a suspicion (one workload failing says nothing about a node): the webhook keeps a
# replacement softly off such nodes while a failure spreads over several (a burst), until
# assess-nodes has seen enough to mark them.
FAILING_WORKLOADS_LABEL: Final = PREFIX + "failing-workloads"
# Label update-annotations puts on a Node at the moment it moves a pod off it for a failure
# counted against the node, its value the move's time in Unix seconds (shared.api.movedoff):
# the earliest signal of a failure spreading over nodes, seconds before assess-nodes' labels.
# The webhook's preference reads its age with node affinity's Lt operator, so a mark stops
# steering once its window passes; assess-nodes' review removes expired ones.
MOVED_OFF_LABEL: Final = PREFIX + "moved-off"
# A Node carrying the project's opt-out label (the same key and rule as the pod's, `opted_out`)
# is never marked, by blame or by pressure rules, gets no usage record and is never rebalanced.
NODE_OPT_OUT_LABEL: Final = OPT_OUT_LABEL
EVENT_NODE_SUSPECTED: Final = "io.kn-rescheduler.node.suspected"
EVENT_NODE_CLEARED: Final = "io.kn-rescheduler.node.cleared"
# Reasons of the Kubernetes Events recorded on Nodes.
REASON_NODE_SUSPECTED: Final = "NodeSuspected"
REASON_NODE_CLEARED: Final = "NodeCleared"
# The node qualifies as suspect, but marking it would put more than the configured share of the
# cluster's schedulable nodes under suspicion: it is left unmarked and this Warning says why.
REASON_SUSPECT_CAP_REACHED: Final = "SuspectCapReached"
# The Ping the assess-nodes PingSource sends: expire suspicions even when no failure comes.
PING_EVENT_TYPE: Final = "dev.knative.sources.ping"

# --- Node pressure (label-nodes): Prometheus rules ---------------------------------------------
# The label dynamicScheduler puts on a node under pressure, spelled as the seed spells it so
# that existing pod manifests (`status NotIn [presure]`) keep working. Configurable.
PRESSURE_LABEL_KEY: Final = "status"
PRESSURE_LABEL_VALUE: Final = "presure"
# JSON on a labelled Node: the rule that fired, its value, and since when.
PRESSURE_ANNOTATION: Final = PREFIX + "pressure"
# Opt-in to the soft affinity away from pressured nodes for pods that are not opted in to
# rescheduling: the annotation "true" on a workload, or the label "true" on a namespace.
AVOID_PRESSURE_KEY: Final = PREFIX + "avoid-pressure"

# --- Load-aware placement (annotate-usage, score-nodes, rebalance-nodes) ------------------------
# Versioned JSON on a Node: its measured CPU and memory usage (percent of allocatable: current,
# 5-minute average, 1-hour maximum), when and from which source it was sampled, and the requests
# of pods bound there too recently to show in the usage (the estimate against herding). The
# extender and rebalance-nodes read it from the Node; nothing on a hot path calls Prometheus.
USAGE_ANNOTATION: Final = PREFIX + "usage"
# Bucket label the annotator keeps with hysteresis, for the scheduler-config-free mode: the
# webhook injects preferred affinities on it into pods that opted in to load-aware placement.
LOAD_LABEL: Final = PREFIX + "load"
LOAD_LOW: Final = "low"
LOAD_MEDIUM: Final = "medium"
LOAD_HIGH: Final = "high"
LOAD_OVERLOADED: Final = "overloaded"
LOAD_BUCKETS: Final = (LOAD_LOW, LOAD_MEDIUM, LOAD_HIGH, LOAD_OVERLOADED)
# A Node labelled for maintenance ("true") is filtered by the extender, labelled overloaded and
# drained gradually by rebalance-nodes.
MAINTENANCE_LABEL: Final = PREFIX + "maintenance"
MAINTENANCE_VALUE: Final = "true"
# Opt-in to load-aware placement in the label mode: the annotation "true" on a workload, or the
# label "true" on a namespace. Not implied by opting in to rescheduling: preferred affinities
# are normalised by their maximum and dilute a pod's own preferences (docs/node-health.md).
LOAD_AWARE_KEY: Final = PREFIX + "load-aware"
# The second scheduler profile that calls the extender (a scheduler of its own: the extenders of
# a KubeSchedulerConfiguration are shared by all its profiles).
LOAD_AWARE_SCHEDULER_NAME: Final = "kn-rescheduler-load-aware"
# Opt-in to rebalancing (rebalance-nodes may evict the workload's pods off hot or maintenance
# nodes): the annotation "true" on the pod's controller (for a Deployment: on the Deployment,
# which its controller copies onto its ReplicaSets), or the label "true" on the namespace.
REBALANCE_KEY: Final = PREFIX + "rebalance"
REBALANCE_VALUE: Final = "true"
# Versioned JSON on a Node that rebalance-nodes keeps: how many consecutive evaluations found the
# node hot, since when, and when it last acted there (Koordinator's anomaly count: act only
# after several hot samples in a row, and start counting afresh after acting).
HOT_STREAK_ANNOTATION: Final = PREFIX + "hot-streak"
# The Kubernetes Event on an evicted pod and its workload, with the node usage that justified it.
REASON_REBALANCED: Final = "Rebalanced"
# A pod bound to a node whose predicted usage with it (measured, plus the requests of the pods
# bound there lately) is over predicted_usage_limit: said on the pod by annotate-usage after the
# binding, never blocking. What a scheduler plugin warns about at PreBind; an extender is not
# called there (docs/load-aware.md, "Against its origin").
REASON_PREDICTED_OVER_LIMIT: Final = "PredictedUsageOverLimit"
# One reply per evaluation that evicted pods (or, in a dry run, would have).
EVENT_POD_REBALANCED: Final = "io.kn-rescheduler.pod.rebalanced"
