"""rebalance-nodes: which pods to move off nodes hot for too long (decide), the evictions
(handler)."""
