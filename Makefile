# Two commands do all set-up:  `make run` (the whole pipeline on a built-in corpus) and `make test`.
# `make test-all` is what CI runs: `make test`, then the slow tests (`make test-slow`).
# `make docs` builds the documentation site into site/ (MkDocs, --strict: any warning fails the build).
PYTHON ?= python3
TORCH ?= torch==2.13.0
ARGS ?=

.PHONY: install run test test-slow test-all bench docs

# torch first: an unpinned torch pulled in by another package would fetch the large CUDA build.
install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install "$(TORCH)"
	$(PYTHON) -m pip install -q -e ".[test,docs]"
	@# A font with Hangul and CJK for the report's figures, where apt can add one (else such text stays out of them).
	-@fc-list 2>/dev/null | grep -qiE "nanum|noto sans cjk" || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& DEBIAN_FRONTEND=noninteractive apt-get install -y -q fonts-nanum >/dev/null 2>&1; } || true

run: install
	$(PYTHON) -m bertkit.cli pipeline $(ARGS)

test: install
	$(PYTHON) -m pytest

# The slow tests (SIGKILL + resume, fault injection, 2- and 4-process gloo runs, ONNX cells, long property tests),
# on an installed checkout (`make install` or `make test` first).
test-slow:
	$(PYTHON) -m pytest -m slow --durations=15

# Everything CI runs: the quick suite, then the slow one.
test-all: test test-slow

docs: install
	NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs build --strict

bench: install
	$(PYTHON) bench/bench_pretrain_step.py
	$(PYTHON) bench/bench_inference.py
	$(PYTHON) bench/bench_prepare.py
