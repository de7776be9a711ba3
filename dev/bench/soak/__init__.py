"""The soak: every function for a while on a production-like local cluster, then the
invariants of doing no harm (issue "Do no harm on a production cluster", part 4).

``python -m dev.bench.soak [--quick]`` (``make soak``; CI runs ``--quick`` through
tests/e2e/test_soak_quick.py). The cluster's neighbours (operator labels and taints, kube-system
add-ons, local volumes, CronJobs, nodes coming and going) are :mod:`localcluster.production`;
one run is :mod:`bench.soak.run` (with the lookalikes of a node's failure, from the fake
kubelet's pod-level behaviours); the client that posts forged CloudEvents is
:mod:`bench.soak.forger`; what the harness watched is :mod:`bench.soak.observe`; the invariants,
pure functions of that record, are :mod:`bench.soak.invariants`. Modelled on the
chaos suite (dev/bench/chaos), which judges moves under faults; this one judges what else a move,
a label or a filter may have touched. docs/reliability.md publishes the figures.
"""
