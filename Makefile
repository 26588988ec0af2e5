# Entry points, all idempotent: `make demo` trains the polyp recipe, `make test` runs the static gate and
# the whole suite, `make fast` the static gate and the tests not marked slow (seconds, for every edit).
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# model=smp_unet's packages for its tests (tests/test_models_smp.py), apart from the venv: the registry's
# torchvision is a CUDA build that imports beside the CPU torch only through robusttrain/_torchvision.py,
# which the rest of the suite must not lean on. Pinned, no dependencies (the venv has the rest).
SMP_EXTRA := segmentation-models-pytorch==0.6.0 timm==1.0.31 torchvision==0.28.0 huggingface_hub==2.4.0 \
	safetensors==0.8.0 httpx2==2.16.2 httpcore2==2.16.2 hf-xet==1.8.0 truststore==0.10.5

.PHONY: demo test test-grid fast lint install clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first, pinned to the local CPU build, so the project's range is already satisfied
# and pip never pulls the CUDA wheels.
$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"
	$(PY) -m pip install -q --no-deps --upgrade --target $(VENV)/smp-extra $(SMP_EXTRA)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m robusttrain fit recipe=polyp

# the static gate: ruff (rules and format, pyproject.toml) and mypy (default strictness, the folders in [tool.mypy])
lint: $(STAMP)
	$(VENV)/bin/ruff check robusttrain tests benchmarks
	$(VENV)/bin/ruff format --check robusttrain tests benchmarks
	$(PY) -m mypy

# the static gate, the docstring examples of the package and the benchmarks, then the test suite: two worker
# processes (one torch thread each, tests/conftest.py) with each test file on one worker (module fixtures
# train once); no test may take more than 5 minutes (--timeout), and the slowest are listed at the end so a
# slow CI can be traced to them. The evidence grids end to end (marker `grid`, ~10-25 min) run apart:
# `make test-grid` (the evidence issues' own check).
test: lint
	$(PY) -m pytest -q --doctest-modules robusttrain benchmarks
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not grid" --timeout 300 --durations=25

test-grid: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile -m grid --durations=10

fast: lint
	$(PY) -m pytest -q --doctest-modules robusttrain benchmarks
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not slow and not grid"

clean:
	rm -rf $(VENV) runs
