"""Node health: failures of several workloads blamed on the node they share (assess-nodes),
the fast path for pods failing on a suspect node, and the soft affinities that steer pods away.

Imports run one way: ``shared.nodehealth`` uses ``shared.platform`` only; the rescheduling and
admission domains use it.
"""
