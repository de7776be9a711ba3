"""Code the kn-rescheduler functions share, one package per domain.

- `platform`: the edges (CloudEvents, the Kubernetes API, settings, logs, metrics);
- `rescheduling`: judging failing pods and moving them;
- `admission`: the webhook that stamps new pods with what rescheduling decided;
- `constants`: every key and event type, the contracts all of them share.

Pure decisions live beside the I/O edges so that each function's entry point is a thin
handler: parse, decide, send. A domain imports the platform, never the other way round.
"""
