# Mirrors CI: `.ci/run` installs what a fresh machine lacks, then runs `make test`.
SHELL := /bin/bash
PY ?= .venv/bin/python
VENV_STAMP := .venv/.installed

.PHONY: venv lint typecheck unit test e2e cluster-bins up down demo bench bench-quick clean

venv: $(VENV_STAMP)
$(VENV_STAMP): requirements.txt requirements-dev.txt
	python3 -m venv .venv
	.venv/bin/pip install --quiet --upgrade pip
	.venv/bin/pip install --quiet -r requirements-dev.txt
	touch $@

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	@# Every function's entry point is a module named main: one mypy run each.
	@for f in functions/*/main.py; do $(PY) -m mypy $$f || exit 1; done

unit: venv
	$(PY) -m pytest -m "not e2e" -q

cluster-bins:
	bash hack/build-bins.sh

e2e: venv cluster-bins
	$(PY) -m pytest -m e2e -q

test: venv cluster-bins
	$(PY) -m pytest -q

up: venv cluster-bins
	$(PY) -m localcluster up --dir .local --nodes $(or $(NODES),4)

down:
	$(PY) -m localcluster down --dir .local
