"""Benchmarks of kn-rescheduler against its peers on the local control plane (issue 6).

``python -m dev.bench [--quick] [--only NAME]`` runs the measurements (see ``dev.bench.__main__``),
writes ``dev/bench/results/<date>.json`` and plots, and ``dev.bench.report`` turns one results file
into ``dev/bench/RESULTS.md``.
"""
