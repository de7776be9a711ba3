"""The chaos suite: a failure storm on the local control plane while things break, then the
invariants a rescheduler must keep, judged on what the API server says (issue 11, part E).

``python -m dev.bench.chaos [--quick]`` (``make chaos``; CI runs ``--quick`` through
tests/e2e/test_chaos_quick.py). What one run does is in :mod:`bench.chaos.run`; the workloads
and sizes in :mod:`bench.chaos.scenario`; the faults in :mod:`bench.chaos.faults` (kills,
restarts) and in Knative's data plane (dev/pipeline/faults.py, injected in the Broker's forwards);
the invariants in :mod:`bench.chaos.invariants`; docs/reliability.md says what each fault
stands for in a real cluster and publishes the figures.

Why here, beside the benchmarks, and not a package of its own: it is a measurement of the
whole system on the same local cluster, with the same results directory, machine description
and identities as dev/bench/ (bench.common), and it is type-checked and linted with the rest of the
tooling. It is not a benchmark against peers: a run passes or fails on its invariants, and its
figures say how hard it was pushed, not how fast anything was.

Nothing in the product knows it is being tested: faults come from outside (signals, process
restarts, a lossy network between Knative's Broker and its peers), and the kills aimed at the
moment between a state write and a pod's removal are triggered by watching the state annotation
change on the API server, not by a hook in the code.
"""
