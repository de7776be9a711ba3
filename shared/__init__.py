"""Code the kn-rescheduler functions share.

Pure decisions (classification, planning, admission patches) live beside the I/O edges
(CloudEvents over HTTP, the Kubernetes API) so that each function's entry point is a thin
handler: parse, decide, send.
"""
