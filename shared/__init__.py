"""Code the kn-rescheduler functions share, in layers; import-linter holds them (pyproject.toml).

- `api`: every key, label, annotation, event type and record we write, with its parser, and the
  wire formats of Kubernetes we read (object shapes, quantities, times). Pure; imports nothing
  else of ours.
- `platform`: the I/O edges that know no domain: CloudEvents, the one Kubernetes API client,
  Prometheus, Events, settings, logs, metrics.
- `workloads`: the pure model every domain reads: a pod's shape, its failure, its owner, its
  policy and state, what moving a Job's pod costs.
- `pods`, `nodes`, `admission`: the domains, one folder per function; independent of each other.

Each function's folder names its halves the same way: `decide.py` is pure (the clock passed
in), `handler.py` does the I/O. docs/architecture.md draws the layers.
"""
