"""The node domain: judging nodes, each function writing one label and one record on a Node.

assess_nodes blames nodes where several workloads failed (the suspect label), label_nodes
applies Prometheus pressure rules (the pressure label), annotate_usage records usage (the load
label), score_nodes is the scheduler extender reading that usage, rebalance_nodes moves pods
off nodes hot for too long. `usage` is the usage record and estimate three of them read.
Independent of the pod domain and of the webhook.
"""
