"""kwok's configuration: which Stages it plays.

kwok plays only node stages and the final pod deletion here:

- ``node-initialize`` (kwok's own ``node/fast`` stage): conditions Ready/MemoryPressure/... and
  phase Running for a new node, keeping the capacity, addresses and nodeInfo we registered;
- ``node-heartbeat-with-lease`` (kwok's own): refreshes node conditions; kwok renews each node's
  Lease in ``kube-node-lease``, so the node lifecycle controller keeps the nodes Ready;
- ``pod-delete``: a pod with a deletionTimestamp and no finalizers is deleted for good after a
  short delay, as a kubelet does once the containers stopped.

Pod status is written by the fake kubelet (:mod:`localcluster.kubelet`), never by kwok, so the
two can never race on a pod.
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

_POD_DELETE: Final = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
    - key: '.metadata.finalizers'
      operator: 'DoesNotExist'
  delay:
    durationMilliseconds: {delete_ms}
  next:
    delete: true
"""


def config_yaml(delete_delay_ms: int = 300) -> str:
    """The ``--config`` file: the Stages above as one YAML stream."""
    docs = [
        _NODE_INITIALIZE,
        _NODE_HEARTBEAT,
        _POD_DELETE.replace("{delete_ms}", str(delete_delay_ms)),
    ]
    return "---\n".join(docs)
