# Mirrors CI: `.ci/run` installs what a fresh machine lacks, then runs `make test`.
SHELL := /bin/bash
PY ?= .venv/bin/python
VENV_STAMP := .venv/.installed

lock_cmd = pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links

.PHONY: lock cleanup cleanup-dry-run venv lint typecheck unit test e2e cluster-bins demo-bins adapter-bin up down demo replay archive bench bench-quick clean fuzz chaos soak real-nodes images-reproducible

venv: $(VENV_STAMP)
$(VENV_STAMP): requirements.txt requirements-dev.txt
	python3 -m venv .venv
	.venv/bin/pip install --quiet --upgrade pip
	.venv/bin/pip install --quiet -r requirements-dev.txt
	touch $@

# requirements.lock: requirements.txt with every transitive package pinned and hashed, what
# the images install (Dockerfile). Run after changing requirements.txt; pip-tools in a venv of
# its own, so the lock does not depend on what the dev venv holds.
lock:
	python3 -m venv .lock-venv && .lock-venv/bin/pip install --quiet pip-tools==7.6.2
	PIP_FIND_LINKS= .lock-venv/bin/$(lock_cmd) --rebuild --output-file requirements.lock requirements.txt
	rm -rf .lock-venv

# After an uninstall: every mark kn-rescheduler wrote, off Nodes and workloads
# (docs/install-upgrade.md); PRESSURE_LABEL=status=presure also takes label-nodes' label off
# where its record shows it wrote it (the settings naming it went with the install).
cleanup: venv
	$(PY) -m kubectl_kn_rescheduler cleanup --yes $(if $(PRESSURE_LABEL),--pressure-label $(PRESSURE_LABEL))
cleanup-dry-run: venv
	$(PY) -m kubectl_kn_rescheduler cleanup --dry-run=server

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	.venv/bin/lint-imports --no-cache
	@# Every function's entry point is a module named main: one mypy run each.
	@for f in functions/*/main.py; do $(PY) -m mypy $$f || exit 1; done

unit: venv
	$(PY) -m pytest -m "not e2e" -q -n 2

cluster-bins:
	bash hack/install-packages.sh
	bash hack/build-bins.sh
	bash hack/build-metrics-server.sh
	bash hack/build-helm.sh
	bash hack/build-krew.sh

# What a cluster of kwok nodes runs (make demo, make up): the control plane, no kubelet,
# kube-proxy or metrics-server, which a first demo would otherwise wait for. With REAL_NODES,
# the real nodes' kubelet and kube-proxy too.
demo-bins:
	bash hack/install-packages.sh
	bash hack/build-bins.sh control-plane $(if $(filter-out 0,$(REAL_NODES)),nodes)

# Knative Eventing's data plane from its Go module: the ApiServerSource receive adapter (pod
# events) and the Broker's ingress, filter and in-memory channel dispatcher, with their CRDs.
adapter-bin:
	bash hack/build-adapter.sh

e2e: venv cluster-bins adapter-bin
	$(PY) -m pytest -m e2e -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

# On TEST_WORKERS pytest-xdist workers (tests/conftest.py says what runs where): the end-to-end
# tests mostly wait on controllers and clocks, so three workers use two cores. Ends with the 20
# slowest tests (setup, call and teardown apart) and the slowest files, fixtures included
# (JUnit XML in .local/test-results.xml), so that every run, CI's included, shows where the
# time goes. TEST_WORKERS=0 runs it all in one process.
TEST_WORKERS ?= 3
TEST_RESULTS ?= .local/test-results.xml
test: venv cluster-bins adapter-bin
	@mkdir -p $(dir $(TEST_RESULTS))
	@status=0; $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder \
	  --durations=20 --junitxml=$(TEST_RESULTS) $(TEST_ARGS) || status=$$?; \
	$(PY) -m dev.tools.durations $(TEST_RESULTS) || true; exit $$status

# Property-based fuzzing of every HTTP entry point and every annotation we parse (tests/fuzz).
# `make test` runs a short, fixed version; this one runs 1,000 examples a property, random,
# keeps failing examples in .local/hypothesis and ends with the figures (examples, failures and
# time per property). FUZZ_ARGS passes pytest options, e.g. "-k webhook".
fuzz: venv
	HYPOTHESIS_PROFILE=fuzz $(PY) -m pytest tests/fuzz -q --show-capture=no --timeout=3600 $(FUZZ_ARGS)

# The control plane and the whole pipeline (functions, Knative's Broker, event source, webhook), in
# the background; `make down` stops it all.
up: venv demo-bins adapter-bin
	$(PY) -m dev.localcluster up --dir .local --nodes $(or $(NODES),4) --real-nodes $(or $(REAL_NODES),0) --with dev.stack.up:components
	@echo "pipeline (broker URL, function URLs, event archive, logs):"
	@cat .local/stack.json

down:
	$(PY) -m dev.localcluster down --dir .local

# Replay recorded events: make replay FILE=.local/stack/archive.jsonl ARGS="--dry-run"
# (a finished demo prints its own FILE). Pod events replay with no cluster; update-annotations
# and assess-nodes need one (make up, then KUBECONFIG=.local/kubeconfig): without, replay says
# so once, skips their events and exits 3. Options: ARGS=--help.
replay: venv
	$(PY) -m kubectl_kn_rescheduler.replay $(or $(FILE),.local/stack/archive.jsonl) $(ARGS)

# The archive of an installed kn-rescheduler (docs/replay.md): every function pod's log, as
# kubectl reads it (KUBECTL=...), made one event archive: make archive [FILE=...], then make
# replay FILE=<the same>. A pod whose log cannot be read (still starting) is named in an error
# line and skipped (--ignore-errors); the file is written whole or not at all.
archive: venv
	@set -o pipefail; out=$(or $(FILE),.local/cluster-archive.jsonl); mkdir -p "$$(dirname "$$out")"; \
	$(KUBECTL) -n $(KNR_NAMESPACE) logs -l app.kubernetes.io/component=function -c function \
	  --tail=-1 --max-log-requests=100 --ignore-errors \
	  | $(PY) -m kubectl_kn_rescheduler.archive - > "$$out.partial" && mv "$$out.partial" "$$out" \
	  && echo "make replay FILE=$$out" || { rm -f "$$out.partial"; exit 1; }

# Benchmarks against the peers (vanilla, the descheduler) on the local control plane (issue 6):
# dev/bench/results/<date>.json, plots, dev/bench/RESULTS.md. bench-quick: tiny sizes, for CI.
# The full real-node suite (docs/testing.md): every test marked real_nodes, the full ones
# included, about 32 minutes; make test runs the short one (about 16, on one of its workers).
real-nodes: venv cluster-bins adapter-bin
	KN_RESCHEDULER_REAL_NODES=full $(PY) -m pytest -q -m "e2e and real_nodes" tests/e2e

# The images' reproducibility in full (docs/security.md): a function built with the layer
# cache and again without it from a copy with other file times, and the Debian base built
# twice from the mirror (make test skips the base: a few minutes).
images-reproducible: venv
	KN_RESCHEDULER_IMAGES=full $(PY) -m pytest -q tests/e2e/test_image_reproducible.py

bench: venv cluster-bins adapter-bin
	$(PY) -m dev.bench

bench-quick: venv cluster-bins adapter-bin
	$(PY) -m dev.bench --quick $(if $(OUT),--out $(OUT))

# Chaos (issue 11): a failure storm of 100 pods while update-annotations is SIGKILLed, the API
# server and etcd restart and the network around Knative's Broker loses source events, resets
# deliveries, duplicates and holds back requests (Knative retrying); then the invariants
# (docs/reliability.md). Writes dev/bench/results/chaos-<date>.json and the table in
# docs/reliability.md; exits 1 on any violation. SEED=n picks another fault schedule. CI runs
# the short version (tests/e2e/test_chaos_quick.py).
chaos: venv cluster-bins adapter-bin
	$(PY) -m dev.bench.chaos $(if $(SEED),--seed $(SEED))

# Soak (do no harm on a production cluster): every function for ten minutes on a local cluster
# with what real ones have (operator labels and taints, kube-system add-ons, local volumes,
# CronJobs, nodes joining, drained and leaving) and faulty nodes; then the invariants
# (docs/reliability.md, "Soak"). Writes dev/bench/results/soak-<date>.json; exits 1 on any violation.
# CI runs the short version (tests/e2e/test_soak_quick.py).
soak: venv cluster-bins adapter-bin
	$(PY) -m dev.bench.soak

# Images and per-function deploys to a Knative cluster (needs a container engine).
include hack/deploy.mk

# The demo (docs/demo.md): a local cluster with faulty nodes, the whole pipeline, and three
# workloads moved off the bad nodes, narrated live; ends with a summary and a timeline PNG.
# DEMO_ARGS passes options, e.g. DEMO_ARGS="--existing" for the cluster in $KUBECONFIG.
# INSTALL=1: Knative Eventing and kn-rescheduler installed from their manifests on real nodes,
# as a platform team installs them (docs/demo.md, "Installed").
demo: venv demo-bins adapter-bin
	$(PY) -m dev.stack.demo $(if $(REAL_NODES),--real-nodes $(REAL_NODES)) $(if $(INSTALL),--install) $(DEMO_ARGS)
