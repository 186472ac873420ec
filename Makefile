# OpenForgeRL — `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
UV_VERSION := 0.13.8
UV := $(PYTHON) -m uv
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-stamp

# Type-checked code: every hand-written package, the tools and the tests (generated code excluded).
TYPED_SRC := libs/core/src libs/testing/src libs/cli/src libs/browser/src $(wildcard services/*/src) tools
TYPED_TESTS := $(wildcard libs/*/tests services/*/tests) tests

.PHONY: help setup harness-clis harnesses test pytest lint typecheck protos protos-check up down status demo

help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}'

# --inexact: the heavy ML stack below is installed with pip into the same venv, and an exact
# uv sync would remove it.
$(STAMP): uv.lock package-lock.json pyproject.toml $(wildcard libs/*/pyproject.toml services/*/pyproject.toml) \
		requirements/inference-cpu.txt requirements/trainer-cpu.txt
	@$(UV) --version 2>/dev/null | grep -q "$(UV_VERSION)" || $(PYTHON) -m pip install -q "uv==$(UV_VERSION)"
	$(UV) sync --frozen --all-packages --inexact
	$(BIN)/python -m ensurepip --default-pip > /dev/null
	$(BIN)/python -m pip install -q --no-deps -r requirements/inference-cpu.txt
	$(BIN)/python -m pip install -q --no-deps -r requirements/trainer-cpu.txt
	npm ci --no-audit --no-fund
	@touch $@

setup: $(STAMP) ## Install everything pinned (uv.lock, requirements/*.txt, package-lock.json) into .venv and node_modules

harness-clis: ## Install the pinned Claude Code, Codex and OpenClaw CLIs (+ Node 24) used by the real-client tests
	bash tools/harness-clis/install.sh

harnesses: setup harness-clis ## Also install mini-swe-agent for the sandboxed rollout tests (needs bubblewrap: apt-get install bubblewrap)
	$(BIN)/openforge harness install mini-swe-agent

lint: setup ## ruff (lint + format check), import contracts (lint-imports: libs never import services, services never each other) and buf lint
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	cd protos && ../node_modules/.bin/buf lint

typecheck: setup ## mypy --strict over libs, services, tools and tests (generated code excluded)
	$(BIN)/mypy $(TYPED_SRC)
	$(BIN)/mypy $(TYPED_TESTS)

protos: setup ## Regenerate libs/api from protos/
	$(BIN)/python tools/gen_protos.py

protos-check: setup ## Fail if the checked-in generated code differs from a fresh generation
	$(BIN)/python tools/gen_protos.py --check

pytest: setup ## Run the test suite only
	$(BIN)/pytest

test: lint typecheck protos-check pytest ## Everything CI runs: lint, type checks, protos-check, tests

demo: setup ## The main job: a whole training run on the embedded defaults (tiny model, warm start, GRPO, eval)
	@command -v bwrap > /dev/null || { echo "bubblewrap is needed for the rollout sandboxes: apt-get install bubblewrap"; exit 1; }
	$(BIN)/openforge harness install mini-swe-agent
	$(BIN)/openforge train examples/demo/demo.yaml

up: setup ## Start NATS and the five services locally (Ctrl-C stops them)
	$(BIN)/openforge up

down: ## Stop what `make up` / `openforge up --detach` started
	$(BIN)/openforge down

status: ## Health of the locally started services
	$(BIN)/openforge status
