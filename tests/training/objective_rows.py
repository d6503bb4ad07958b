"""The objective table's rows as tiny pretraining runs, for the tests that must hold for every row (no device read
between log steps, gloo processes equal to one process, SIGKILL + --resume).

`cases()` enumerates bertkit.models.registry.OBJECTIVES: one case per objective row and model file (the BERT family
shares one; ModernBERT's rows of the same objective are cases of their own), so a new row is covered without
editing a test. `pretrain_args(case, data, run)` is the row's `bertkit pretrain` command line on a tiny model, and
`prepared(case, root)` the shards it reads (the tokenizer kind the architecture needs).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

from bertkit.cli import main
from bertkit.models.registry import ARCHITECTURES, OBJECTIVES

WORDS = "the a cat dog sat ran on under mat park big small red blue house river city old new".split()

# The ids the issue tracker and the docs use for some rows (others are named by their objective)
CASE_IDS = {("bert", "bert"): "bert-nsp", ("albert", "bert"): "sop", ("roberta", "bert"): "roberta-full-sentences",
            ("roberta-doc", "bert"): "roberta-doc-sentences", ("t5", "t5"): "t5-spans", ("xlnet", "xlnet"): "xlnet-plm",
            ("roberta", "modernbert"): "modernbert-mlm", ("roberta-doc", "modernbert"): "modernbert-mlm-doc"}

# Tiny sizes per model file (config class), no dropout (so that N processes draw no other masks than one)
SIZES = {
    "BertConfig": ["--hidden-size", "32", "--num-hidden-layers", "2", "--num-attention-heads", "2",
                   "--intermediate-size", "64", "--hidden-dropout-prob", "0", "--attention-probs-dropout-prob", "0"],
    "ModernBertConfig": ["--hidden-size", "32", "--num-hidden-layers", "2", "--num-attention-heads", "2",
                         "--intermediate-size", "48", "--local-attention", "8"],
    "T5Config": ["--d-model", "32", "--d-kv", "8", "--d-ff", "64", "--num-layers", "2", "--num-heads", "4",
                 "--dropout-rate", "0"],
    "XLNetConfig": ["--d-model", "32", "--n-layer", "2", "--n-head", "4", "--d-inner", "48", "--reuse-len", "8",
                    "--mem-len", "16", "--dropout", "0"],
    "ElmoConfig": ["--lstm-dim", "48", "--projection-dim", "16", "--dropout", "0", "--sampled-softmax", "0"],
}
LENGTH = {"ElmoConfig": "9"}  # ELMo's windows are words; the others' rows tokens
# The tokenizer an architecture's rows read (WordPiece otherwise): T5 needs sentinels, XLNet <cls>/<sep>, ELMo words
TOKENIZERS = {"t5": ["--kind", "unigram", "--vocab-size", "220", "--extra-ids", "100"],
              "xlnet": ["--kind", "unigram", "--xlnet", "--vocab-size", "120"],
              "elmo": ["--kind", "word", "--vocab-size", "40"]}
WORDPIECE = ["--kind", "wordpiece", "--vocab-size", "120", "--min-frequency", "1"]


@dataclass(frozen=True)
class Case:
    id: str  # the test id
    objective: str  # the objective row
    architecture: str  # the architecture row it trains

    @property
    def tokenizer(self) -> list[str]:
        return TOKENIZERS.get(self.architecture, WORDPIECE)


def cases() -> list[Case]:
    """One case per objective row and model file: the row's first architecture, and the first of each other
    config class among its architectures."""
    out = []
    for name, row in OBJECTIVES.items():
        seen = set()
        for arch in row.architectures:
            config_class = ARCHITECTURES[arch].config_class
            if config_class in seen:
                continue
            seen.add(config_class)
            out.append(Case(CASE_IDS.get((name, arch), name if not out or arch == row.architectures[0]
                                         else f"{arch}-{name}"), name, arch))
    return out


def corpus(path: Path) -> Path:
    rng = random.Random(0)
    docs = ["\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))) + " ."
                      for _ in range(rng.randint(2, 5))) for _ in range(60)]
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def prepared(case: Case, root: Path) -> Path:
    """The shards of a tiny corpus tokenized as the case's architecture needs (made once per tokenizer kind under
    root)."""
    key = "-".join(arg.lstrip("-") for arg in case.tokenizer)
    data = root / f"data-{key}"
    if not data.is_dir():
        text = root / "corpus.txt" if (root / "corpus.txt").is_file() else corpus(root / "corpus.txt")
        assert main(["tokenizer", "train", "--files", str(text), *case.tokenizer, "--out", str(root / f"tok-{key}"),
                     "--quiet"]) == 0
        assert main(["prepare", "--corpus", str(text), "--tokenizer", str(root / f"tok-{key}"), "--out", str(data),
                     "--eval-fraction", "0.1", "--quiet"]) == 0
    return data


def pretrain_args(case: Case, data: Path, run: Path, *extra: str) -> list[str]:
    """`bertkit pretrain` for the case on a tiny model: the objective, its architecture (and the config fields its
    row requires: ELECTRA's model_type, the causal LM's causal), tiny sizes; `extra` after them."""
    row, arch = OBJECTIVES[case.objective], ARCHITECTURES[case.architecture]
    config_class = arch.config_class.__name__
    recipe = f"{arch.name}-mini" if arch.name != "bert" and row.implies is None and \
        arch.config_class is not ARCHITECTURES["bert"].config_class else "mini"
    recipe = f"{row.implies}-mini" if row.implies is not None else recipe
    args = ["pretrain", "--data", str(data), "--out", str(run), "--config", recipe, "--objective", case.objective,
            "--preset", "tiny", *SIZES[config_class], "--max-seq-length", LENGTH.get(config_class, "32"),
            "--max-predictions-per-seq", "5", "--eval-every", "0", "--eval-instances", "0", "--progress", "false",
            "--learning-rate", "2e-3", "--warmup-steps", "0"]
    if config_class == "ModernBertConfig" and row.instances == "full-sentences":
        args += ["--isolate-documents", "true"]  # ModernBERT's packed rows keep their documents apart
    fields = dict(arch.config_fields)
    if row.requires is not None:
        fields[row.requires[0]] = row.requires[1]
    if arch.config_class is ARCHITECTURES["bert"].config_class and arch.model_type != "bert":
        fields.setdefault("model_type", arch.model_type)
    for name, value in fields.items():
        args += [f"--{name.replace('_', '-')}", str(value).lower() if isinstance(value, bool) else str(value)]
    return [*args, *extra]


def run_all(root: Path, processes: int, steps: int = 12) -> None:
    """Every case's run of `steps` steps (a global batch of 8, a checkpoint every 3 steps) on this process, one
    after another, into root/<case id>-p<processes>: run under torchrun, every rank runs them all (one process start
    and one rendezvous per process for the whole table). The shards must be prepared first (`prepared`)."""
    for case in cases():
        run = root / f"{case.id}-p{processes}"
        # One process group after another in the same processes: each under its own keys of torchrun's store
        # (the prefix the trainer gives a restarted attempt), so no rank reads an address of the group before
        os.environ["TORCHELASTIC_RESTART_COUNT"] = f"row-{case.id}"
        assert main(pretrain_args(case, prepared(case, root), run, *run_args(processes, steps))) == 0, case.id


def run_args(processes: int, steps: int = 12) -> list[str]:
    """The step, batch and checkpoint settings every run of a case shares (a global batch of 8 on `processes`)."""
    return ["--max-steps", str(steps), "--save-every", "3", "--batch-size", str(8 // processes), "--log-every", "1",
            "--workers", "0"]


if __name__ == "__main__":  # python tests/training/objective_rows.py ROOT PROCESSES (under torchrun for more than one)
    import sys

    run_all(Path(sys.argv[1]), int(sys.argv[2]))
