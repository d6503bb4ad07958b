# Two commands do all set-up:  `make run` (the whole pipeline on a built-in corpus) and `make test`.
# `make docs` builds the documentation site into site/ (MkDocs, --strict: any warning fails the build).
PYTHON ?= python3
TORCH ?= torch==2.13.0
ARGS ?=

.PHONY: install run test bench docs

# torch first: an unpinned torch pulled in by another package would fetch the large CUDA build.
install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install "$(TORCH)"
	$(PYTHON) -m pip install -q -e ".[test,docs]"

run: install
	$(PYTHON) -m bertkit.cli pipeline $(ARGS)

test: install
	$(PYTHON) -m pytest

docs: install
	NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs build --strict

bench: install
	$(PYTHON) bench/bench_pretrain_step.py
	$(PYTHON) bench/bench_inference.py
	$(PYTHON) bench/bench_prepare.py
