# The two set-up commands of the README work on a fresh machine: each installs
# what it needs into .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
JOBS   ?= 2

.PHONY: install demo test test-fast test-kernel lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch pinned: this version lies on local disk as a CPU build; an
	# unpinned torch would pull a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test,lint]'
	touch $(STAMP)

demo: install
	$(VENV)/bin/k2back verify --geometry tiny --arch gfx942 --tp 4 --ratio 2 --tokens 3

test: install
	$(PY) -m pytest -n $(JOBS) --dist worksteal --durations=15

# Tiers (markers in pyproject.toml): units and the emulator's small unit kernels;
# the K2 kernel's end-to-end runs short of the big geometries; `test` runs all (CI).
test-fast: install
	$(PY) -m pytest -n $(JOBS) --dist worksteal -m "not slow and not kernel"

test-kernel: install
	$(PY) -m pytest -n $(JOBS) --dist worksteal -m "kernel and not slow"

lint: install
	$(VENV)/bin/ruff check k2back tests benchmarks

bench: install
	for b in benchmarks/*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info
