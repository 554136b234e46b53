# Two commands on a fresh machine, nothing else to type:
#
#   make quickstart   # creates .venv if missing, installs torch (pinned) and ablate, runs the quickstart
#   make test         # the same set-up plus the test extras, then the test suite
#
# `make test-fast` skips the slow end-to-end tests; `make lint` runs ruff and mypy (CI runs both).
# `make gpu-check` checks a GPU machine end to end (no .venv: the machine's own torch with CUDA).
# Set-up happens once per .venv and again only when pyproject.toml changes.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of this release lies on the project's machines; a bare `torch` requirement would
# pull a multi-GB CUDA build. On a GPU machine: make TORCH='torch==2.13.0 --index-url <cuda index>'
TORCH ?= torch==2.13.0
PYTEST_ARGS ?=
# the suite in two processes (pytest-xdist): its slow tests wait on subprocesses, Ray and servers
# as much as they compute; TEST_WORKERS=0 runs it in this process (e.g. to debug one failure)
TEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist worksteal)

.PHONY: setup setup-test quickstart test test-fast lint check clean-venv gpu-check

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# pip byte-compiles what it installs on one core (105 of the 175 s a fresh set-up took on the 2-core
# machines); here pip installs, then compileall byte-compiles site-packages on every core (one
# process per core, each given 40 of its entries: compileall's own -j sends every file to a worker,
# 13 s on a tree already compiled against 1 s), leaving out the packages' own tests and
# transformers' model zoo (a module left out compiles when first imported). Compiled here, not at
# first import: every process of the suite (Ray's daemons and workers, the CLI, SLURM's nodes)
# imports compiled code even where PYTHONDONTWRITEBYTECODE is set. compileall exits 1 on a file of
# a newer Python's syntax (torch ships one): that status is not the set-up's.
PIP_INSTALL := $(PY) -m pip install -q --no-compile
BYTE_COMPILE := find $$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
	-mindepth 1 -maxdepth 1 -print0 | xargs -0 -P $$($(PY) -c 'import os; print(os.cpu_count() or 1)') -n 40 \
	$(PY) -m compileall -q -x '/(tests?|transformers/models)/' > /dev/null 2>&1 || true

$(VENV)/.installed: $(PY) pyproject.toml
	$(PIP_INSTALL) $(TORCH)
	$(PIP_INSTALL) -e .
	$(BYTE_COMPILE)
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP_INSTALL) -e '.[test]'
	$(BYTE_COMPILE)
	touch $@

setup: $(VENV)/.installed

setup-test: $(VENV)/.installed-test

# the report of your own run goes to runs/quickstart/report/ (ignored by git): the kept one in
# reports/quickstart/ is rewritten only by `ablate report studies/quickstart.yaml`
quickstart: setup
	$(VENV)/bin/ablate run studies/quickstart.yaml --no-report
	$(VENV)/bin/ablate report studies/quickstart.yaml -o runs/quickstart/report

test: setup-test
	$(PY) -m pytest -q $(XDIST) $(PYTEST_ARGS)

test-fast: setup-test
	$(PY) -m pytest -q $(XDIST) -m "not slow" $(PYTEST_ARGS)

lint: setup-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

check: lint test

clean-venv:
	rm -rf $(VENV)

# On a GPU machine, with the python3 that has torch with CUDA (nothing installed, no network
# needed): the GPU tests, the GPU benchmark, the GPU study and its report, one ddp and one fsdp
# step on NCCL, into reports/gpu/<date>-<device>/. WHEELS=dir installs the wheel files in dir
# (pydantic and its three dependencies for the study) into a temporary folder first.
GPU_PYTHON ?= python3
WHEELS ?=
GPU_CHECK_ARGS ?=
gpu-check:
	@site=""; \
	if [ -n "$(WHEELS)" ]; then \
		site=$$(mktemp -d) && \
		$(GPU_PYTHON) -m pip install -q --no-index --no-deps --no-compile --target $$site $(WHEELS)/*.whl || exit 1; \
	fi; \
	PYTHONPATH="$(CURDIR)$${site:+:$$site}" PYTHONUNBUFFERED=1 $(GPU_PYTHON) -m ablate.bench.gpu_check $(GPU_CHECK_ARGS)
