"""Benchmark: fine-tuning steps of bertkit's BertForSequenceClassification against transformers', on identical
weights, each side on the SST-2 batches its own training loop makes.

A step is what a fine-tuning loop does per batch: zero the gradients, forward with the class labels (cross-entropy),
backward, AdamW step (fused, both sides). fp32, train mode (dropout 0.1 on), torch's default thread count. The
model is a randomly initialised sequence classifier (2 labels) of a bertkit size preset (default `base`, BERT-base)
with Google's 30,522-token uncased vocabulary: bertkit's is initialised from a seed, written with `save_pretrained`
and loaded by transformers' `BertForSequenceClassification.from_pretrained` (its default attention
implementation); their eval-mode logits and loss are checked to agree before anything is timed.

Data: the SST-2 training sentences (../shared/data/glue/SST-2/train.tsv, 67,349 rows), tokenised once by
bertkit's tokenizer with the uncased vocabulary, `[CLS] sentence [SEP]` cut to --max-length (128) tokens. An
epoch over them is batched as each library's user gets it:

    bertkit       its fine-tuning loader, `bertkit.tasks.run.EpochBatches` with the default length bucketing (each
                  window of 50 batches of the seeded shuffle sorted by length, cut, the batches shuffled); every
                  batch padded to its longest row
    transformers  a seeded `torch.randperm` of the examples (DataLoader(shuffle=True)), batches padded to their
                  longest row by transformers' `DataCollatorWithPadding` (dynamic padding)

Both epochs hold the same examples, and a round is --batches (4) batches of --batch-size (32) examples on each
side, the same batches in every round. They are *representative* batches of each side's epoch (`representative`:
the epoch's batches ranked by padded size, cut into equal strata, the batch nearest each stratum's mean taken),
not the same examples on both sides: a round of a few bucketed batches shuffled for transformers would pad far
less than a real shuffled epoch does (47% instead of 67% of the positions with 4 batches on SST-2), and a few
random batches would make either side's figure a lottery (bucketed batches run from 32 x 3 to 32 x 66 positions).
--same-examples gives that conservative pairing instead: transformers trains on bertkit's round, shuffled.
After warm-up rounds, timed rounds alternate transformers, bertkit, ... (common.py `time_alternating`).

Examples/s = examples per round / median round time; tokens/s counts each side's real tokens only; the padding
fields are padded positions / all positions of a side's round. MFU = model FLOPs of a side's round / its median
round time / measured fp32 matmul peak (same run), with model FLOPs per real token of a sequence of real length T:
6 x N + 12 x L x H x T, N = the encoder's non-embedding parameters (layers and pooler; the 2-way classifier adds
2H + 2, < 0.01%), see common.model_flops. Padding does no useful work and is not counted.

Prints one JSON line; ratio = bertkit / transformers examples/s (> 1: bertkit is faster).

    python bench/bench_finetune_step.py [--preset base] [--max-length 128] [--batch-size 32] [--batches N]
                                        [--iters N] [--warmup N] [--same-examples] [--data DIR]
                                        [--vocab vocab.txt] [--quick]

--quick: 2 batches per round, 1 warm-up + 2 timed rounds and a 0.5 s peak measurement: a smoke run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

try:  # `python bench/bench_finetune_step.py` puts bench/ on sys.path; `bench.` when imported from the repo root
    from bench.common import (PeakMeter, emit, log, median, mfu, model_flops, rates, resolve_counts,
                              time_alternating)
except ImportError:
    from common import (PeakMeter, emit, log, median, mfu, model_flops, rates, resolve_counts,
                        time_alternating)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "glue"
DEFAULT_VOCAB = ROOT.parent / "shared" / "data" / "vocab" / "bert-base-uncased-vocab.txt"
# BERT's fine-tuning AdamW settings on every parameter (cost is what matters), the fused kernel on both sides.
ADAMW = dict(lr=5e-5, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, fused=True)
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "labels")


# ------------------------------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------------------------------
def sst2_features(data_dir: Path, vocab: Path, max_length: int) -> tuple[list[dict], int]:
    """(features, pad id): `[CLS] sentence [SEP]` ids, token types and the class id of every SST-2 training row."""
    from bertkit import WordPieceTokenizer
    from bertkit.tasks.glue import get_task, read_glue

    examples = read_glue("sst2", data_dir / "SST-2" / "train.tsv")
    to_id = get_task("sst2").label_to_id
    tokenizer = WordPieceTokenizer.from_vocab(vocab)
    encoded = tokenizer.encode_batch([e.text for e in examples], max_length=max_length)
    return [{"input_ids": enc.input_ids, "token_type_ids": enc.token_type_ids, "label": to_id[e.label]}
            for enc, e in zip(encoded, examples)], tokenizer.pad_id


def representative(lengths: list[list[int]], k: int) -> list[int]:
    """Indices of k of the given batches (real lengths of their rows) that together cost what k average batches
    of the epoch cost: the batches are ranked by padded size (rows x longest), cut into k equal strata, and from
    each the batch closest to the stratum's mean padded size and mean real tokens is taken (sorted indices).

    An epoch's batches cost very different amounts (bertkit's bucketed batches run from 32 x 3 to 32 x 66
    positions), so a few batches picked at random would make the figure a lottery; these k keep the epoch's mean.
    """
    padded = np.array([len(rows) * max(rows) for rows in lengths], dtype=np.float64)
    real = np.array([sum(rows) for rows in lengths], dtype=np.float64)
    chosen = []
    for stratum in np.array_split(np.argsort(padded, kind="stable"), k):
        distance = (np.abs(padded[stratum] - padded[stratum].mean()) / padded[stratum].mean()
                    + np.abs(real[stratum] - real[stratum].mean()) / real[stratum].mean())
        chosen.append(int(stratum[np.argmin(distance)]))
    return sorted(chosen)


def bertkit_batches(features: list[dict], pad_id: int, batch_size: int, k: int,
                    seed: int) -> tuple[list[dict], list[int]]:
    """(k representative batches of epoch 0 of bertkit's fine-tuning loader (EpochBatches, default bucketing),
    exactly as the loader yields them, in its order; the indices of their examples)."""
    from bertkit.tasks.run import EpochBatches, FinetuneConfig

    stream = EpochBatches(features, pad_id, batch_size, seed, bucket_window=FinetuneConfig().bucket_window)
    epoch = stream.epoch_batches(0)
    out, examples = [], []
    for step in representative([[len(features[i]["input_ids"]) for i in b] for b in epoch], k):
        stream.load_state_dict({"epoch": 0, "step": step, "micro": 0})  # seek there, as a resumed run does
        out.append({key: value for key, value in next(iter(stream)).items() if key in MODEL_INPUTS})
        examples += epoch[step].tolist()
    return out, examples


def transformers_batches(features: list[dict], batch_size: int, k: int, vocab: Path, seed: int,
                         examples: list[int] | None = None) -> list[dict]:
    """k representative batches of a shuffled epoch (torch.randperm, as DataLoader(shuffle=True)) padded by
    transformers' DataCollatorWithPadding: what a transformers user's loop trains on. With `examples`: those
    examples shuffled and cut into batches instead."""
    from transformers import BertTokenizer, DataCollatorWithPadding

    collator = DataCollatorWithPadding(BertTokenizer(str(vocab)))  # the vocabulary only gives it [PAD]'s id
    generator = torch.Generator().manual_seed(seed)
    if examples is None:
        order = torch.randperm(len(features), generator=generator).tolist()
        epoch = [order[start:start + batch_size] for start in range(0, len(order) - batch_size + 1, batch_size)]
        chosen = [epoch[step] for step in representative([[len(features[i]["input_ids"]) for i in b]
                                                          for b in epoch], k)]
    else:
        order = [examples[i] for i in torch.randperm(len(examples), generator=generator).tolist()]
        chosen = [order[start:start + batch_size] for start in range(0, len(order), batch_size)]
    return [collator([{"input_ids": features[i]["input_ids"], "token_type_ids": features[i]["token_type_ids"],
                       "attention_mask": [1] * len(features[i]["input_ids"]), "label": features[i]["label"]}
                      for i in batch]) for batch in chosen]


def real_lengths(batches: list[dict]) -> list[int]:
    return [n for batch in batches for n in batch["attention_mask"].sum(1).tolist()]


def padding_fraction(batches: list[dict]) -> float:
    """Padded positions / all positions of some batches: the share of the work that computes on padding."""
    return 1 - sum(real_lengths(batches)) / sum(batch["attention_mask"].numel() for batch in batches)


# ------------------------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------------------------
def classifier_pair(preset: str, seed: int = 0):
    """(config, bertkit classifier, transformers classifier): 2 labels, identical weights, fp32 on CPU (as
    common.model_pair: bertkit initialises, `save_pretrained`, transformers `from_pretrained`)."""
    import transformers

    from bertkit import BertConfig
    from bertkit.models import BertForSequenceClassification

    config = BertConfig.preset(preset, vocab_size=30522)
    torch.manual_seed(seed)
    ours = BertForSequenceClassification(config, num_labels=2)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()  # stderr is for this script's progress lines
    with tempfile.TemporaryDirectory() as tmp:
        ours.save_pretrained(tmp)
        peer = transformers.BertForSequenceClassification.from_pretrained(tmp)
    return config, ours, peer


@torch.no_grad()
def check_same_function(ours, peer, batch: dict, atol: float = 1e-4) -> None:
    """Refuse to time two models that do not compute the same thing: eval-mode logits and loss on one batch."""
    ours.eval(), peer.eval()
    a, b = ours(**batch), peer(**batch)
    diff = max((a.logits - b.logits).abs().max().item(), abs(a.loss.item() - b.loss.item()))
    if diff > atol:
        raise SystemExit(f"bertkit and transformers disagree on identical weights (max |diff| {diff:.2e}); "
                         f"the benchmark would compare different computations")


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict) -> None:
    """zero_grad, forward with the labels (cross-entropy), backward, AdamW step: one fine-tuning step."""
    optimizer.zero_grad(set_to_none=True)
    model(**batch).loss.backward()
    optimizer.step()


def run(preset: str, max_length: int, batch_size: int, batches: int, iters: int, warmup: int, peak_seconds: float,
        data_dir: Path, vocab: Path, seed: int = 0, same_examples: bool = False) -> dict | None:
    """The benchmark's result record, or None (with a message) when SST-2 or the vocabulary is not there."""
    for path in (data_dir / "SST-2" / "train.tsv", vocab):
        if not path.is_file():
            log(f"skipped: {path} not found (SST-2 from GLUE and Google's uncased vocab.txt; see "
                f"../shared/data/README.md)")
            return None
    meter = PeakMeter()
    log(f"measuring the fp32 matmul peak for {peak_seconds:g} s ...")
    log(f"peak {meter.measure(peak_seconds):.1f} GFLOP/s with {torch.get_num_threads()} threads")
    features, pad_id = sst2_features(data_dir, vocab, max_length)
    ours_batches, examples = bertkit_batches(features, pad_id, batch_size, batches, seed)
    rounds = {"bertkit": ours_batches, "transformers": transformers_batches(
        features, batch_size, batches, vocab, seed, examples if same_examples else None)}
    log(f"SST-2: {len(features):,} training sentences; a round is {batches} batches of {batch_size}: padding "
        f"{padding_fraction(rounds['bertkit']):.1%} (bertkit, bucketed) vs "
        f"{padding_fraction(rounds['transformers']):.1%} (transformers, shuffled)")
    config, ours, peer = classifier_pair(preset, seed)
    # Before any step: once trained (different dropout draws), the two copies' weights drift apart.
    check_same_function(ours, peer, rounds["transformers"][0])
    optimizers = {"bertkit": torch.optim.AdamW(ours.parameters(), **ADAMW),
                  "transformers": torch.optim.AdamW(peer.parameters(), **ADAMW)}
    ours.train(), peer.train()
    models = {"bertkit": ours, "transformers": peer}

    def one_round(side: str):
        return lambda: [train_step(models[side], optimizers[side], batch) for batch in rounds[side]]

    log(f"finetune_step {preset} T<={max_length} B={batch_size}: {warmup} warm-up + {iters} timed rounds")
    times = time_alternating({"transformers": one_round("transformers"), "bertkit": one_round("bertkit")},
                             iters=iters, warmup=warmup)
    meter.measure(peak_seconds / 4)
    fields = rates(times, batches * batch_size, "examples_per_s", "round_s")
    del fields["_median_s"]
    record = {"bench": "finetune_step", "preset": preset, "data": "sst2", "max_length": max_length,
              "batch_size": batch_size, "batches": batches, "same_examples": same_examples}
    for key, value in fields.items():
        record[key] = value
        if key == "ratio_best":  # MFU beside the ratios, from each side's own real tokens
            for side in ("bertkit", "transformers"):
                flops = model_flops(config, real_lengths(rounds[side]), training=True, mlm_head=False)
                record[f"{side}_mfu"] = round(mfu(flops, median(times[side]), meter.gflops), 4)
            record["peak_gflops"] = round(meter.gflops, 1)
    for side in ("bertkit", "transformers"):
        record[f"{side}_tokens_per_s"] = round(sum(real_lengths(rounds[side])) / median(times[side]), 2)
    for side in ("bertkit", "transformers"):
        record[f"{side}_padding"] = round(padding_fraction(rounds[side]), 4)
    record.update(bertkit_real_tokens=sum(real_lengths(rounds["bertkit"])),
                  transformers_real_tokens=sum(real_lengths(rounds["transformers"])),
                  threads=torch.get_num_threads(), iters=iters, warmup=warmup)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="base", metavar="NAME",
                        help="size preset of bertkit.BertConfig.preset (default: base)")
    parser.add_argument("--max-length", type=int, default=128, metavar="T",
                        help="tokens per sentence at most, [CLS] and [SEP] included (default 128)")
    parser.add_argument("--batch-size", type=int, default=32, help="examples per step (default 32)")
    parser.add_argument("--batches", type=int, default=None, help="steps per round (default 4; --quick 2)")
    parser.add_argument("--iters", type=int, default=None, help="timed rounds per side (default 5)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed rounds first (default 1)")
    parser.add_argument("--peak-seconds", type=float, default=None, help="time spent measuring the matmul peak "
                                                                          "(default 2)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"GLUE folder (default {DEFAULT_DATA})")
    parser.add_argument("--vocab", type=Path, default=DEFAULT_VOCAB, help=f"default {DEFAULT_VOCAB}")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 batches per round, 2 timed rounds, "
                                                             "1 warm-up, 0.5 s peak")
    parser.add_argument("--same-examples", action="store_true",
                        help="transformers trains on bertkit's round, shuffled, instead of its own epoch's "
                             "batches (pads less than a real shuffled epoch: a conservative figure)")
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(_default_iters=5, _default_warmup=1)
    args = parser.parse_args(argv)
    iters, warmup, peak_seconds = resolve_counts(args)
    batches = args.batches if args.batches is not None else (2 if args.quick else 4)
    if batches < 1 or args.batch_size < 1:
        raise SystemExit("--batches and --batch-size must be at least 1")
    record = run(args.preset, args.max_length, args.batch_size, batches, iters, warmup, peak_seconds, args.data,
                 args.vocab, args.seed, args.same_examples)
    if record is not None:
        emit(record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
