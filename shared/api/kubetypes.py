"""TypedDicts for the raw Kubernetes and AdmissionReview JSON that crosses our edges.

They describe only the fields we read. Everything arrives as plain JSON (a CloudEvent's data,
an AdmissionReview body, the API's dict form), so these are views, never validated schemas:
code reading them still copes with missing keys.
"""

from typing import Any, TypedDict


class OwnerReference(TypedDict, total=False):
    apiVersion: str
    kind: str
    name: str
    uid: str
    controller: bool


class ObjectMeta(TypedDict, total=False):
    name: str
    generateName: str
    namespace: str
    uid: str
    resourceVersion: str
    labels: dict[str, str]
    annotations: dict[str, str]
    ownerReferences: list[OwnerReference]
    deletionTimestamp: str
    creationTimestamp: str
    finalizers: list[str]


class ContainerStateWaiting(TypedDict, total=False):
    reason: str
    message: str


class ContainerStateTerminated(TypedDict, total=False):
    exitCode: int
    reason: str
    message: str
    startedAt: str
    finishedAt: str


class ContainerStateRunning(TypedDict, total=False):
    startedAt: str


class ContainerState(TypedDict, total=False):
    waiting: ContainerStateWaiting
    running: ContainerStateRunning
    terminated: ContainerStateTerminated


class ContainerStatus(TypedDict, total=False):
    name: str
    ready: bool
    started: bool
    restartCount: int
    image: str
    state: ContainerState
    lastState: ContainerState


class PodCondition(TypedDict, total=False):
    type: str
    status: str
    reason: str
    message: str
    lastTransitionTime: str


class PodStatus(TypedDict, total=False):
    phase: str
    reason: str
    message: str
    startTime: str
    conditions: list[PodCondition]
    containerStatuses: list[ContainerStatus]
    initContainerStatuses: list[ContainerStatus]


class PodSpec(TypedDict, total=False):
    nodeName: str
    restartPolicy: str
    affinity: dict[str, Any]
    # Pod-level requests and limits (PodLevelResources): a pod-wide memory limit.
    resources: dict[str, Any]
    containers: list[dict[str, Any]]
    initContainers: list[dict[str, Any]]


class Pod(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: PodSpec
    status: PodStatus


# A Job, as far as the cost of moving one of its pods goes (pkg/controller/job).
class PodFailurePolicyOnExitCodes(TypedDict, total=False):
    containerName: str
    operator: str
    values: list[int]


class PodFailurePolicyOnPodCondition(TypedDict, total=False):
    type: str
    status: str


class PodFailurePolicyRule(TypedDict, total=False):
    action: str
    onExitCodes: PodFailurePolicyOnExitCodes
    onPodConditions: list[PodFailurePolicyOnPodCondition]


class PodFailurePolicy(TypedDict, total=False):
    rules: list[PodFailurePolicyRule]


class PodTemplate(TypedDict, total=False):
    metadata: ObjectMeta
    spec: PodSpec


class JobSpec(TypedDict, total=False):
    backoffLimit: int
    backoffLimitPerIndex: int
    completionMode: str
    managedBy: str
    podFailurePolicy: PodFailurePolicy
    podReplacementPolicy: str
    template: PodTemplate


class UncountedTerminatedPods(TypedDict, total=False):
    succeeded: list[str]
    failed: list[str]


class JobStatus(TypedDict, total=False):
    failed: int
    uncountedTerminatedPods: UncountedTerminatedPods


class Job(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: JobSpec
    status: JobStatus


class AdmissionRequest(TypedDict, total=False):
    uid: str
    kind: dict[str, str]
    resource: dict[str, str]
    operation: str
    namespace: str
    name: str
    object: Pod
    dryRun: bool


class AdmissionReview(TypedDict, total=False):
    apiVersion: str
    kind: str
    request: AdmissionRequest
    response: dict[str, Any]


# Node affinity, as the webhook reads and extends it. PodSpec.affinity stays a plain dict so
# callers that build pods need not know these.
class NodeSelectorRequirement(TypedDict, total=False):
    key: str
    operator: str
    values: list[str]


class NodeSelectorTerm(TypedDict, total=False):
    matchExpressions: list[NodeSelectorRequirement]
    matchFields: list[NodeSelectorRequirement]


class NodeSelector(TypedDict, total=False):
    nodeSelectorTerms: list[NodeSelectorTerm]


class PreferredSchedulingTerm(TypedDict):
    weight: int
    preference: NodeSelectorTerm


class NodeAffinity(TypedDict, total=False):
    requiredDuringSchedulingIgnoredDuringExecution: NodeSelector
    preferredDuringSchedulingIgnoredDuringExecution: list[PreferredSchedulingTerm]


class Affinity(TypedDict, total=False):
    nodeAffinity: NodeAffinity
    podAffinity: dict[str, Any]
    podAntiAffinity: dict[str, Any]


# A Node, as far as the node-level functions read it (what the API server and the scheduler's
# extender request carry).
class Taint(TypedDict, total=False):
    key: str
    value: str
    effect: str


class NodeSpec(TypedDict, total=False):
    unschedulable: bool
    taints: list[Taint]


class NodeAddress(TypedDict, total=False):
    type: str
    address: str


class NodeStatus(TypedDict, total=False):
    # Quantities as the API writes them: {"cpu": "4", "memory": "16Gi", "pods": "110"}.
    capacity: dict[str, str]
    allocatable: dict[str, str]
    addresses: list[NodeAddress]
    conditions: list[dict[str, Any]]


class Node(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: NodeSpec
    status: NodeStatus
