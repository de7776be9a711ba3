"""Knative Eventing's data plane on the local control plane: pod events and the Broker.

- :mod:`dev.pipeline.source` runs Knative's own ApiServerSource receive adapter against a
  kube-apiserver (``ApiServerSource``).
- :mod:`dev.pipeline.broker` runs Knative's own Broker data plane (ingress, in-memory channel
  dispatcher, filter) and writes what Knative's controllers would (``KnativeBroker``).
- :mod:`dev.pipeline.netns` gives it a network namespace and loopback forwards.
- :mod:`dev.pipeline.filters` and :mod:`dev.pipeline.triggers` hold Knative's filter rules and
manifest
  checks for replay, which routes recorded events in-process; :mod:`dev.pipeline.cloudevent` the
  HTTP encoding.
"""
