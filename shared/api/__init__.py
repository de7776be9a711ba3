"""The contract: what kn-rescheduler writes on Kubernetes objects and sends as CloudEvents.

Every key, label, annotation, event type and versioned record lives here with its parser beside
it, so that what live clusters carry has one home. Pure, and imports nothing else of ours: the
layers above read the contract, the contract reads nobody. Wire formats never change without a
migration.
"""
