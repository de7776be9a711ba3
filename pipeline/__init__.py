"""The local stand-in for Knative's data plane: pod events and a Broker.

- :mod:`pipeline.source` runs Knative's own ApiServerSource receive adapter against a
  kube-apiserver (``ApiServerSource``).
- :mod:`pipeline.router` is the Broker: ingress, Trigger filters, retries, replies, dead letters
  (``Router``, ``python -m pipeline.router``).
- :mod:`pipeline.filters` and :mod:`pipeline.triggers` hold Knative's filter and delivery rules;
  :mod:`pipeline.cloudevent` the HTTP encoding.

See docs/pipeline.md.
"""
