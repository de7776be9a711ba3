# One image per function, all from this file:
#
#   make image FN=detect-failures      without a daemon (hack/build-image.sh: buildah, on a
#                                      Debian base made by mmdebstrap, passed as PYTHON_IMAGE)
#   docker build --build-arg FUNCTION=detect-failures -t REGISTRY/detect-failures .
#
# `python` and `pip` are the base's: the stock python image's, or the venv that is first on
# PATH in the Debian base (Debian's own pip is externally managed, PEP 668).
#
# The image holds the runtime dependencies (requirements.lock, hashed), shared/, the one function and
# the gunicorn settings every function uses, nothing else. It starts the function exactly as
# dev/stack/functions.py::command() does locally (tests/e2e/test_function_commands.py compares).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/app \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PORT=8080
WORKDIR /app

# Build-time only, not kept in the image: the CA bundle and index pip should use when the build
# host reaches the package index through a TLS-intercepting proxy or a mirror
# (hack/build-image.sh passes the host's). Unset unless given with --build-arg.
ARG PIP_CERT
ARG PIP_INDEX_URL

# Dependencies first: this layer is shared by all the images and survives code changes. Nothing
# above it may depend on FUNCTION: a build argument in scope changes the cache key of every RUN
# after it, and each image would install the dependencies again.
# requirements.lock is requirements.txt resolved with every transitive package pinned and
# hashed (`make lock`): pip refuses any file whose hash it does not list, and resolves nothing.
COPY requirements.lock ./
RUN pip install --no-cache-dir --require-hashes --no-deps -r requirements.lock

# The code every function shares, byte-compiled here: the root filesystem is read-only at run
# time, and a cold start should not compile anything.
COPY shared/ shared/
COPY functions/gunicorn.conf.py functions/gunicorn.conf.py
RUN python -m compileall -q shared functions

# Only the layers from here on differ between the functions.
ARG FUNCTION
RUN test -n "${FUNCTION}" || { echo "build with --build-arg FUNCTION=<function name>" >&2; exit 1; }
ENV FUNCTION=${FUNCTION}
COPY functions/${FUNCTION}/ functions/${FUNCTION}/
RUN test -f "functions/${FUNCTION}/main.py" || { echo "no function ${FUNCTION}" >&2; exit 1; } \
    && python -m compileall -q "functions/${FUNCTION}"

# The version it is built as (make's TAG: `git describe`, or what you pass), in the image's
# labels and in every log line (KN_RESCHEDULER_VERSION), so a pod says which build it runs. Two
# tags are two images, and a new tag rolls a Deployment out. After the last RUN: it changes no
# cached layer, only the image's config.
ARG VERSION=dev
LABEL org.opencontainers.image.version="${VERSION}"
ENV KN_RESCHEDULER_VERSION=${VERSION}

# A numeric user, so that runAsNonRoot can be verified by the kubelet.
USER 65532:65532
# Knative sets PORT to the container port; gunicorn.conf.py binds to it.
EXPOSE 8080
# exec: gunicorn becomes PID 1 and gets SIGTERM. The shell is only there to put ${FUNCTION}
# into the app factory's arguments.
CMD exec python -m gunicorn -c functions/gunicorn.conf.py "functions_framework:create_app(target=\"handle\", source=\"functions/${FUNCTION}/main.py\")"
