"""The admission webhook: stamp new pods (and Jobs) with what rescheduling decided.

`mutation` is the pure patch of a new pod, built from the state the rescheduling domain keeps
on its owner; `review` answers the AdmissionReview around it. Separate because it runs on the
API server's request path, where it must never block a pod's creation, and it only reads
what the rescheduling domain decided, never decides a move.
"""
