# keylane: `make run` starts broker + topics + worker on this machine; `make test` runs every check.
# Both install what they need first (a virtualenv in .venv, apt packages, the Kafka jars).
SHELL := /bin/bash
.DEFAULT_GOAL := help
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BROKER := $(PY) deploy/kafka/local_kafka.py
PYTEST_ARGS ?=

.PHONY: help install system-deps lint test chaos run broker broker-stop clean bench bench-quick bench-gate bench-profile

help:
	@echo "make run          install, start a local Kafka, apply topics, run a worker (Ctrl-C, or kill -INT the pid it prints, stops all)"
	@echo "make test         install, lint, type-check and run every test against a real broker"
	@echo "make broker       start a local single-node Kafka 3.9 (NODES=3 for a cluster) and print its address"
	@echo "make broker-stop  stop the local Kafka started by 'make broker'"
	@echo "make lint         ruff and mypy --strict"
	@echo "make chaos        the long kill -9 chaos runs (CHAOS_SEEDS, CHAOS_EVENTS, CHAOS_KILLS; CHAOS_TESTS; about 40 min a seed)"
	@echo "make bench        every benchmark, 3 runs of each (about 30 min: the recovery runs fill 100k keys); writes bench-report.md"
	@echo "make bench-quick  the same harness on less data, 3 runs of each (about 8 min)"
	@echo "make bench-gate   fail if the last run misses the seed's budget or a target of bench/targets.py"
	@echo "make bench-profile  a worker and the plain Faust peer under load, sampled by py-spy: bench/out/profile-*"

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test,dev,bench]'
	@touch $@

system-deps:
	@deploy/install-system-deps.sh

install: system-deps $(STAMP)
	@$(BROKER) jars >/dev/null

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# pytest exits 5 when it collected nothing; make treats that like any other failure.
test: lint
	$(PY) -m pytest -v $(PYTEST_ARGS)

# The long chaos runs: every seed in CHAOS_SEEDS, all of them even when one fails
# (`make test` runs each chaos test once, short, but those marked chaos_long). CHAOS_TESTS
# narrows the run, e.g.
# CHAOS_TESTS=tests/chaos/test_exactly_once_chaos.py.
CHAOS_SEEDS ?= 1 2 3
CHAOS_EVENTS ?= 10000
CHAOS_KILLS ?= 30
CHAOS_TESTS ?= tests/chaos
chaos: install
	@failed=""; for seed in $(CHAOS_SEEDS); do \
		echo "== chaos seed $$seed: $(CHAOS_EVENTS) events, $(CHAOS_KILLS) kills"; \
		CHAOS_SEED=$$seed CHAOS_EVENTS=$(CHAOS_EVENTS) CHAOS_KILLS=$(CHAOS_KILLS) \
			$(PY) -m pytest -v -s -m chaos $(CHAOS_TESTS) $(PYTEST_ARGS) || failed="$$failed $$seed"; \
	done; \
	if [ -n "$$failed" ]; then echo "chaos failed for seeds:$$failed"; exit 1; fi

bench: install
	$(PY) -m bench.run --size full

bench-quick: install
	$(PY) -m bench.run --size quick

bench-gate: install
	$(PY) -m bench.gate bench/out/results.json

bench-profile: install
	$(PY) -m bench.profile

run: install
	$(PY) deploy/run_local.py

broker: install
	@$(BROKER) start --nodes $(or $(NODES),1)

broker-stop:
	@$(PYTHON) deploy/kafka/local_kafka.py stop

clean: broker-stop
	rm -rf .kafka-local .keylane-data $(VENV)
