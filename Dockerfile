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

# The stock base by digest (Docker's official python image, 3.11.16 on bookworm: the index of
# every platform it is built for). A tag moves with every rebuild upstream; a digest names one
# image.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:fe556eaffd0d96abd8685b83bb8a69addd0dc730fa193669a7df0d49ddcfac02
FROM ${PYTHON_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/app \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PORT=8080
WORKDIR /app

# Dependencies first: this layer is shared by all the images and survives code changes. Nothing
# above it may depend on FUNCTION: a build argument in scope changes the cache key of every RUN
# after it, and each image would install the dependencies again.
# requirements.lock is requirements.txt resolved with every transitive package pinned and
# hashed (`make lock`): pip refuses any file whose hash it does not list, and resolves nothing.
# The byte code pip writes is checked against each source's hash, not its time (py_compile's
# choice whenever SOURCE_DATE_EPOCH is set, whatever its value): a time would be when pip
# unpacked the file, and two builds would differ.
# A build host that reaches the index through a TLS-intercepting proxy or a mirror gives pip its
# settings as build secrets (hack/build-image.sh gives the host's): `pipconf`, a pip.conf, and
# `pipca`, the CA bundle it names as /run/knr-build-ca.crt. A secret is there for this step
# only: in no layer, and not in the image's history as a build argument would be (with the
# index URL's credentials, and a host with a mirror building another image). Without them,
# pip's defaults.
COPY requirements.lock ./
RUN --mount=type=secret,id=pipconf,target=/etc/pip.conf \
    --mount=type=secret,id=pipca,target=/run/knr-build-ca.crt \
    SOURCE_DATE_EPOCH=0 pip install --no-cache-dir --require-hashes --no-deps -r requirements.lock

# The code every function shares, byte-compiled here: the root filesystem is read-only at run
# time, and a cold start should not compile anything. Checked against the source's hash, like
# the dependencies': the time in the byte code would be the copied file's, which is the
# checkout's in a docker build (buildah's --timestamp sets it, hack/build-image.sh).
COPY shared/ shared/
COPY functions/gunicorn.conf.py functions/gunicorn.conf.py
RUN python -m compileall -q --invalidation-mode checked-hash shared functions

# Only the layers from here on differ between the functions.
ARG FUNCTION
RUN test -n "${FUNCTION}" || { echo "build with --build-arg FUNCTION=<function name>" >&2; exit 1; }
ENV FUNCTION=${FUNCTION}
COPY functions/${FUNCTION}/ functions/${FUNCTION}/
RUN test -f "functions/${FUNCTION}/main.py" || { echo "no function ${FUNCTION}" >&2; exit 1; } \
    && python -m compileall -q --invalidation-mode checked-hash "functions/${FUNCTION}"

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
