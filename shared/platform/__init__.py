"""The platform edges: what every domain needs to talk to Kubernetes and Knative.

CloudEvents in and out, the one Kubernetes API client, settings (and the Go durations they are
written in), logs, metrics and the typed views of the JSON that crosses the edges. Kept apart
so the domains above it decide without knowing how a request is sent or a setting is read;
nothing here imports a domain.
"""
