# Two commands a newcomer needs: `make serve` (the main job) and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install test pytest docs notebooks waste clean gpu-check

install: $(STAMP)

# The stamp is rebuilt only when the project's dependencies change, so a second
# `make install` does nothing. torch is pinned first: on these machines 2.13.0
# is a local CPU build, and an unpinned torch would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[test,docs]'
	touch $(STAMP)

test: install
	$(PY) -m pytest -p no:cacheprovider
	$(MAKE) docs
	$(MAKE) notebooks

docs: install
	$(VENV)/bin/mkdocs build --strict --site-dir site

notebooks: install
	$(PY) tools/run_notebooks.py docs/notebooks

waste: install
	$(PY) -m paged.bench waste

.PHONY: serve
serve: install
	$(PY) -m paged.serve

# On a machine with a CUDA GPU: build csrc/cuda, run the cuda-marked tests and the
# kernel benchmark, and keep each one's output in $(OUT) (issue 5). Uses the venv
# if there is one, else creates it; PY=/path/to/python picks another interpreter
# or a name on PATH (it needs a CUDA build of torch). Fails if any step fails.
gpu-check:
	@test -n "$(OUT)" || { echo "usage: make gpu-check OUT=<folder> [PY=python]" >&2; exit 2; }
	@command -v "$(PY)" >/dev/null 2>&1 || $(MAKE) install
	@mkdir -p "$(OUT)"; status=0; \
	{ date -u; nvidia-smi || true; } >"$(OUT)/gpu.txt" 2>&1; \
	$(PY) -c 'import paged.kernels.cuda as c; c.load(verbose=True); print("paged_cuda built:", c.available())' \
		>"$(OUT)/build.txt" 2>&1 || status=1; tail -n 5 "$(OUT)/build.txt"; \
	$(PY) -m pytest -p no:cacheprovider -m cuda -ra >"$(OUT)/pytest-cuda.txt" 2>&1 || status=1; \
		tail -n 15 "$(OUT)/pytest-cuda.txt"; \
	$(PY) -m paged.bench kernel --device cuda --json >"$(OUT)/bench-kernel.txt" 2>&1 || status=1; \
		cat "$(OUT)/bench-kernel.txt"; \
	echo "gpu-check outputs in $(OUT) (exit $$status)"; exit $$status

clean:
	rm -rf site build .pytest_cache .hypothesis
