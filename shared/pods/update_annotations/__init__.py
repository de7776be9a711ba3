"""update-annotations: record the failure on the workload and move the pod. The move is
planned as a value, its requests in order (decide), and sent by the handler; with the
replacement's body (bodies), rollouts' copies of our state (rollouts) and replacements
headed for a node they were kept off (replacements)."""
