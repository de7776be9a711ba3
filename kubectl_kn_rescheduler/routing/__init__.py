"""Knative's routing of events to Triggers, read from Trigger manifests or objects: which
function a recorded event goes to, as the Broker would send it.

The plugin's ``replay`` routes by the Triggers installed in the cluster; the local Broker
(dev/pipeline/broker.py) and ``make replay`` by those of ``knative/``.
"""
