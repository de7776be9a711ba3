"""The platform edges: what every domain needs to talk to Kubernetes and Knative.

CloudEvents in and out, the one Kubernetes API client, Prometheus queries, Kubernetes Events,
settings, logs and metrics. Kept apart so the domains above it decide without knowing how a
request is sent or a setting is read; nothing here imports a domain, only the contract below
it (shared.api: keys, object shapes, times).
"""
