# Two commands a newcomer needs: `make waste` (the main job for now) and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install test pytest docs notebooks waste clean

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

clean:
	rm -rf site build .pytest_cache .hypothesis
