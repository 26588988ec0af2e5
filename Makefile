# Entry points, all idempotent: `make demo` trains the polyp recipe, `make test` runs the static gate and
# the whole suite, `make fast` the static gate and the tests not marked slow (seconds, for every edit).
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test fast lint install clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first, pinned to the local CPU build, so the project's range is already satisfied
# and pip never pulls the CUDA wheels.
$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m robusttrain fit recipe=polyp

# the static gate: ruff (rules in pyproject.toml) and mypy (default strictness, the folders in [tool.mypy])
lint: $(STAMP)
	$(VENV)/bin/ruff check robusttrain tests benchmarks
	$(PY) -m mypy

# the static gate, the docstring examples of the package, then the test suite: two worker processes
# (one torch thread each, tests/conftest.py) with each test file on one worker (module fixtures train once);
# the slowest tests are listed at the end so a slow CI can be traced to them
test: lint
	$(PY) -m pytest -q --doctest-modules robusttrain
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=25

fast: lint
	$(PY) -m pytest -q --doctest-modules robusttrain
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not slow"

clean:
	rm -rf $(VENV) runs
