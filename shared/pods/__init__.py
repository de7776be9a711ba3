"""The pod domain: failing pods found and moved.

detect_failures judges every pod event, sweep_failures finds failing pods no event reported,
update_annotations records the failure on the workload and moves the pod. `failing` is the
event they pass between them. Independent of the node domain and of the webhook.
"""
