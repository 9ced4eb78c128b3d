# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
# Each creates .venv (Python 3.11) if it is missing or stale, then does its job.

PYTHON_BOOT ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TFF_VERSION := 0.87.0
export TF_CPP_MIN_LOG_LEVEL ?= 3
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: run test venv clean-venv benchmark

# The stamp depends on the requirements: edit them and the next make reinstalls.
$(STAMP): requirements.txt setup.py
	@test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip==24.0
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	# TFF pins jax/jaxlib 0.4.14, which PyPI no longer serves: install it
	# without its dependency resolution (its dependencies come from requirements.txt).
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps tensorflow-federated==$(TFF_VERSION)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	$(PY) -c "import tensorflow_federated as tff; print('tensorflow-federated', tff.__version__)"
	@touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(PY) launch/train.py --task=synthetic --root_output_dir=runs --experiment_name=default

test: $(STAMP)
	$(PY) -m pytest -q tests

clean-venv:
	rm -rf $(VENV)
