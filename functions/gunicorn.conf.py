"""gunicorn settings shared by every function image and by the local stack.

One command serves any function, in its container and on a laptop alike:

    gunicorn -c functions/gunicorn.conf.py \
      'functions_framework:create_app(target="handle", source="functions/NAME/main.py")'

PORT is honoured as Knative sets it; TLS_CERT_FILE and TLS_KEY_FILE turn on TLS (the webhook:
the API server only calls webhooks over HTTPS). TLS_CLIENT_CA_FILE, with TLS on, makes the TLS
handshake require a client certificate signed by that CA: a caller without one is refused
before any HTTP is spoken. The API server presents such a certificate when its
AdmissionConfiguration names a kubeconfig for the webhook (docs/install-hardening.md, "Hardening the
webhook").
"""

import os
import ssl

bind = f"{os.environ.get('HOST', '0.0.0.0')}:{os.environ.get('PORT', '8080')}"
# One process, several threads: the handlers wait on the API server, not on the CPU, and
# Knative scales out by adding pods. WORKERS/THREADS override it for load tests.
workers = int(os.environ.get("WORKERS", "1"))
threads = int(os.environ.get("THREADS", "8"))
worker_class = "gthread"
# Knative's queue-proxy enforces the request timeout; gunicorn must not kill slow calls first.
# The arbiter replaces a worker whose main loop stops heartbeating for this long (a stopped
# or wedged process). gthread's main loop heartbeats while requests run in its threads, so a
# long request is never cut by it; a worker whose threads all hang is found by the liveness
# probe on /healthz instead.
timeout = int(os.environ.get("WORKER_TIMEOUT", "60"))
graceful_timeout = 10
# Logs are JSON lines written by the functions themselves; gunicorn's own stay terse.
accesslog = None
errorlog = "-"
loglevel = os.environ.get("GUNICORN_LOG_LEVEL", "warning")
if os.environ.get("TLS_CERT_FILE") and os.environ.get("TLS_KEY_FILE"):
    certfile = os.environ["TLS_CERT_FILE"]
    keyfile = os.environ["TLS_KEY_FILE"]
    if os.environ.get("TLS_CLIENT_CA_FILE"):
        # gunicorn builds a fresh SSLContext for every connection, so a rotated CA file (a
        # mounted ConfigMap or Secret) is picked up without a restart, like the serving pair.
        # Only this CA is trusted for clients, never the system's roots.
        ca_certs = os.environ["TLS_CLIENT_CA_FILE"]
        cert_reqs = ssl.CERT_REQUIRED
elif os.environ.get("TLS_CLIENT_CA_FILE"):
    raise RuntimeError("TLS_CLIENT_CA_FILE needs TLS: set TLS_CERT_FILE and TLS_KEY_FILE too")
