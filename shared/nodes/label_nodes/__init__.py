"""label-nodes: Prometheus pressure rules (rules), which nodes to label (decide), the writes
(handler)."""
