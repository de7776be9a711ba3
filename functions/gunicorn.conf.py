"""gunicorn settings shared by every function image and by the local stack.

One command serves any function, in its container and on a laptop alike:

    gunicorn -c functions/gunicorn.conf.py \
      'functions_framework:create_app(target="handle", source="functions/NAME/main.py")'

PORT is honoured as Knative sets it; TLS_CERT_FILE and TLS_KEY_FILE turn on TLS (the webhook:
the API server only calls webhooks over HTTPS).
"""

import os

bind = f"{os.environ.get('HOST', '0.0.0.0')}:{os.environ.get('PORT', '8080')}"
# One process, several threads: the handlers wait on the API server, not on the CPU, and
# Knative scales out by adding pods. WORKERS/THREADS override it for load tests.
workers = int(os.environ.get("WORKERS", "1"))
threads = int(os.environ.get("THREADS", "8"))
worker_class = "gthread"
# Knative's queue-proxy enforces the request timeout; gunicorn must not kill slow calls first.
timeout = 0
graceful_timeout = 10
# Logs are JSON lines written by the functions themselves; gunicorn's own stay terse.
accesslog = None
errorlog = "-"
loglevel = os.environ.get("GUNICORN_LOG_LEVEL", "warning")
if os.environ.get("TLS_CERT_FILE") and os.environ.get("TLS_KEY_FILE"):
    certfile = os.environ["TLS_CERT_FILE"]
    keyfile = os.environ["TLS_KEY_FILE"]
