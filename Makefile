# The two commands of README.md: `sudo make run` and `sudo make test`.
# Both run bootstrap.sh first, which installs what is missing and is quick
# the second time.

VENV ?= .venv
export VENV
PYTHON := $(VENV)/bin/python
SCENARIO ?= ocs-reconfig
ARGS ?=

.PHONY: setup setup-tests run test unit integration vm-test bench bench-model clean

setup:
	./bootstrap.sh

# The tests also need chromium and its driver (the web view's browser tests).
setup-tests:
	./bootstrap.sh --with-browser

run: setup
	$(PYTHON) -m emu.run $(SCENARIO) $(ARGS)

test: setup-tests
	$(PYTHON) -m pytest tests -v

unit: setup
	$(PYTHON) -m pytest tests/unit -q

integration: setup-tests
	$(PYTHON) -m pytest tests/integration -v

# OVS's kernel datapath and netem, which this machine's kernel lacks: the
# `vm` tests (tests/vm) in a Debian 12 VM under qemu's software emulation
# (vm/run-test). Not part of `make test`; see README.md.
vm-test:
	vm/run-test

bench: setup
	$(PYTHON) bench/fidelity

bench-model: setup
	$(PYTHON) bench/model --validate --perf

clean: setup
	$(PYTHON) -m emu.clean
