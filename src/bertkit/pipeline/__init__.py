"""The main job in one call: raw text -> vocabulary -> shards -> pretraining -> label-efficiency curve -> report.

`bertkit pipeline` (`make run`) is the README's first command; `run_pipeline` (`bertkit.pipeline.run`) runs its
stages, all within one time budget, each from the module named beside it:

    1 corpus       (corpus) the user's files, or text already on the machine: the docstrings of the Python
                   standard library and the installed packages, read with `ast` from the source files (nothing is
                   imported or executed; nothing of that text ships with bertkit); (task) the built-in task
    2 vocabulary   (corpus) a WordPiece vocabulary trained on the corpus, uncased; accents stripped only where that
                   takes accents off Latin, Greek or Cyrillic letters and changes no other letter
                   (`choose_normalisation`: Hangul syllables stay whole, not NFD jamo)
    3 shards       `bertkit prepare`, 3% of the documents held out
    4 plan         (plan) the machine (CPU model and flags, GPU), the model size (tiny on a CPU, small on a CUDA
                   GPU), the precision (bf16 autocast where the CPU has native bf16 instructions and it is not
                   clearly slower than fp32 there, else fp32), a few timed training steps, and from them the split
                   of the budget between pretraining and the curve's runs (`plan_budget`)
    5 pretraining  the `mini-fast` recipe, held-out masked-LM accuracy and perplexity at about 30 regular points
    6 curve        (curve) the label-efficiency curve: the pretrained model and the same architecture from random
                   initialisation trained on class-balanced label sets of 64, 128, 256, 512, 2,048, ... examples and
                   on all of them, same recipe, label sets and seeds for both (`label_ladder`, `stratified_order`,
                   `passes_for`): 7 seeds at 64 labels, 3 at 128-512, 1 planned above (up to 3 with time left); up
                   to 512 labels a logistic regression on the frozen encoder, and beside it the baseline a reader
                   expects, random initialisation fine-tuned on the same label sets (`BASELINE_SEEDS`); the task is
                   the user's (`task_train` / `task_dev`, any file `bertkit finetune classify` reads, pairs
                   included) or the built-in one (`build_word_salad_task`)
    7 evaluation   (evaluation) fill-mask on held-out sentences by the masked word's frequency band, beside the
                   frequency baseline, and the report: OUT/report.json and OUT/report.html (one self-contained
                   page, `bertkit.pipeline.report`, the curve at its centre; `bertkit.pipeline.plots` draws)

Beside them, `bertkit.pipeline.analyze` (`bertkit analyze layers`). This package's own names below are the ones
the docs show, loaded on first use: importing `bertkit.pipeline.plots` or `.report` (`bertkit plot`, `bertkit
card`) loads neither torch nor the training code.
"""

from __future__ import annotations

import importlib
from typing import Any

# Name -> the module of this package that defines it.
_EXPORTS = {"run_pipeline": "run", "build_word_salad_task": "task", "default_corpus": "corpus"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'bertkit.pipeline' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"bertkit.pipeline.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
