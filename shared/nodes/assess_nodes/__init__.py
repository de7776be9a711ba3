"""assess-nodes: blame nodes where several workloads failed (decide), mark them (handler)."""
