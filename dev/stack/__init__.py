"""The local stack around the control plane: the functions as real servers (gunicorn, the
webhook over TLS and registered with the API server), wired like Knative wires them."""
