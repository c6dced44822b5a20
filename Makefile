# Everything runs inside a virtual environment at .venv/ (created on demand).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The dashboard's browser test drives Debian's Chromium through Playwright (no
# `playwright install` download); only `make test` needs it.
CHROMIUM := /usr/bin/chromium
SUDO     := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT      := $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get

.PHONY: install lock chromium demo test test-fast lint fmt typecheck openapi bench chaos fuzz mutation serve clean

# every role and the dev tools, the roles' packages at the versions the images run
# (requirements/worker.lock; the dev tools and pgserver are not locked)
$(STAMP): pyproject.toml requirements/worker.lock
	@command -v java >/dev/null 2>&1 || { echo "error: Java 17 is required by Spark (install openjdk-17-jre-headless)"; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[all,dev]' -c requirements/worker.lock
	@touch $(STAMP)

install: $(STAMP)

# The lock files the images install from (docs/operations.md, "Pinned dependencies"): the
# worker's first, then the control plane's at the same versions. Kept pins stay unless
# UPGRADE=1 (all to the newest allowed) or, e.g., UPGRADE_PACKAGE=fastapi.
LOCK_FLAGS := --quiet --strip-extras --no-emit-index-url --no-emit-find-links
LOCK_UPGRADE = $(if $(UPGRADE),--upgrade) $(if $(UPGRADE_PACKAGE),--upgrade-package $(UPGRADE_PACKAGE))
# (not on $(STAMP): that installs from the locks this rewrites)
lock:
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@test -x $(BIN)/pip-compile || $(BIN)/python -m pip install --quiet 'pip-tools>=7.4'
	$(BIN)/pip-compile $(LOCK_FLAGS) $(LOCK_UPGRADE) --extra worker -o requirements/worker.lock pyproject.toml
	$(BIN)/pip-compile $(LOCK_FLAGS) --upgrade -c requirements/worker.lock -o requirements/control-plane.lock pyproject.toml

# installed only when missing; the package lists are refreshed only if that fails
$(CHROMIUM):
	$(APT) install -y chromium || { $(APT) update && $(APT) install -y chromium; }

chromium: $(CHROMIUM)

demo: $(STAMP)
	$(BIN)/backfill demo

serve: $(STAMP)
	$(BIN)/backfill serve

# the tests' temporary files (an embedded Postgres among them) stay in the checkout:
# pytest's shared default under /tmp keeps only its last three runs, so another run on
# the machine could delete a running one's database
PYTEST_TMP := --basetemp=.pytest-tmp

# the slowest tests are listed at the end: CI's budget is 30 minutes
test: $(STAMP) $(CHROMIUM)
	$(BIN)/python -m pytest $(PYTEST_TMP) --durations=30 $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_TMP) $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

typecheck: $(STAMP)
	$(BIN)/mypy

openapi: $(STAMP)
	$(BIN)/backfill openapi --output openapi.yaml

# BENCH_ARGS: e.g. --quick, or --only backfill
bench: $(STAMP)
	$(BIN)/python -m bench $(BENCH_ARGS)

# long chaos runs: random workloads, jobs, settings and faults until MINUTES have passed
MINUTES ?= 10
chaos: $(STAMP)
	$(BIN)/python -m tests.kit.chaos --minutes $(MINUTES)

# the OpenAPI contract under schemathesis with every check (tests/integration/test_contract.py,
# which CI runs with 8 examples an operation) with FUZZ_EXAMPLES; FUZZ_SEED picks another run
FUZZ_EXAMPLES ?= 200
FUZZ_SEED     ?= 20261127
fuzz: $(STAMP)
	CONTRACT_EXAMPLES=$(FUZZ_EXAMPLES) CONTRACT_SEED=$(FUZZ_SEED) $(BIN)/python -m pytest tests/integration/test_contract.py $(PYTEST_TMP) -q

# mutation score (not part of `make test`): mutmut mutates backfill_core/executors/ and
# vnode.py and runs the unit and property tests that reach each mutant; MUTATION_SET=commit
# mutates the commit / fence / visibility functions of the meta, workers and store against
# their Postgres tests. Writes the table and survivors into bench/RESULTS.md.
MUTATION_SET  ?= core
MUTATION_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
mutation: $(STAMP)
	$(BIN)/python -m tests.kit.mutation --set $(MUTATION_SET) --jobs $(MUTATION_JOBS) --record

clean:
	rm -rf $(VENV) .pytest_cache .pytest-tmp .mypy_cache .ruff_cache mutants
