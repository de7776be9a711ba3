"""kwok's configuration: which Stages it plays.

kwok plays only node stages here:

- ``node-initialize`` (kwok's own ``node/fast`` stage): conditions Ready/MemoryPressure/... and
  phase Running for a new node, keeping the capacity, addresses and nodeInfo we registered;
- ``node-heartbeat-with-lease`` (kwok's own): refreshes node conditions; kwok renews each node's
  Lease in ``kube-node-lease``, so the node lifecycle controller keeps the nodes Ready;
Pods are left entirely to the fake kubelet (:mod:`localcluster.kubelet`): it writes their
status and, when one is deleted, stops it, writes it terminal and removes it. kwok's own
pod-delete stage removes a pod without making it terminal first (so a Job with a pod failure
policy would never replace it), deletes by name, without a uid precondition, and sometimes
twice, so it could delete a StatefulSet's brand-new pod of the same name; the fake kubelet
deletes with the uid as precondition.
"""

from __future__ import annotations

from typing import Final

_NODE_INITIALIZE: Final = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-initialize
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values:
      - 'True'
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $lastTransitionTime := or .metadata.creationTimestamp $now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $lastTransitionTime | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type  | Quote}}
      {{ end }}
      phase: Running
"""

_NODE_HEARTBEAT: Final = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-heartbeat-with-lease
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Running'
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'In'
      values:
      - 'True'
  delay:
    durationMilliseconds: 600000
    jitterDurationMilliseconds: 610000
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $lastTransitionTime := or .metadata.creationTimestamp $now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $lastTransitionTime | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}
"""

# kwok falls back to its default pod stages when it is given none; this one never matches, so
# kwok leaves pods alone.
_POD_NOTHING: Final = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-left-to-the-fake-kubelet
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.annotations["sim.kn-rescheduler.io/kwok-never"]'
      operator: 'Exists'
  next:
    delete: true
"""


def config_yaml() -> str:
    """The ``--config`` file: the Stages above as one YAML stream."""
    docs = [_NODE_INITIALIZE, _NODE_HEARTBEAT, _POD_NOTHING]
    return "---\n".join(docs)
