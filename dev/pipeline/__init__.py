"""Knative Eventing's data plane on the local control plane: pod events and the Broker.

- :mod:`dev.pipeline.source` runs Knative's own ApiServerSource receive adapter against a
  kube-apiserver (``ApiServerSource``).
- :mod:`dev.pipeline.broker` runs Knative's own Broker data plane (ingress, in-memory channel
  dispatcher, filter) and writes what Knative's controllers would (``KnativeBroker``).
- :mod:`dev.pipeline.netns` gives it a network namespace and loopback forwards.
- Knative's filter rules and Trigger checks live in :mod:`kubectl_kn_rescheduler.routing`,
  which the Broker here and the replay (the plugin's and ``make replay``) share;
  :mod:`dev.pipeline.cloudevent` is the HTTP encoding.
"""
