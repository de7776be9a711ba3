"""The rescheduling domain: which failing pod to move, where not to put it again, and how.

Judging a failure (classify, podshape), the per-workload budget and exclusions kept on the pod
(policy, state), who owns the pod and what moving it costs (owners, rollouts, jobs), and the
handlers that detect, sweep and move. Separate from the webhook, which only reads the state
this domain writes, and from the platform edges it calls.
"""
