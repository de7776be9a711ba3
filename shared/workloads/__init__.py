"""The workload model every domain reads: pure, over the api and the platform.

A pod's shape and whether its failure is one another node could fix (podshape, classify),
the user's policy and the state kept on the owner (policy, state), who owns a pod (owners),
what moving a Job's pod costs (jobs), whether the workload fails everywhere (siblings,
everywhere) and the fast path's rules (fastpath). The webhook, the pod functions and the
node functions all read these; none of them decides a move.
"""
