"""The admission webhook (mutate-admission): stamp new pods and Jobs with what the pod domain
recorded on their owner and what the node domain wrote on Nodes.

`decide` is the pure patch of a new pod; `handler` answers the AdmissionReview around it. It
runs on the API server's request path, where it must never block a pod's creation, and it
only reads the contract (shared.api) through the workload model, never decides a move.
"""
