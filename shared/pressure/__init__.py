"""The node-pressure domain: which nodes a set of Prometheus rules says are under pressure.

The rule file and its built-in defaults (rules), the pure decision of which nodes to label,
keep or clear (decide), and the handler that queries Prometheus and patches Nodes (labeler).
It reads metrics through shared.platform.prometheus and writes Nodes through
shared.platform.kube; the webhook only reads the label this domain writes.
"""
