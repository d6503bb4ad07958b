"""Benchmark: T5 training steps of bertkit's T5ForConditionalGeneration against transformers', on identical weights
and the same batches.

A step is what the trainer does per batch: zero the gradients, forward with the targets, backward, AdamW step
(fused, both sides). bertkit runs it as its trainer does (the span-corruption / text-to-text objective: the decoder
reads the targets shifted right, cross-entropy summed over the real target tokens and divided by their count; on
its fast paths, packed rows (several examples per row, `bertkit.models.t5.pack`), the three attention projections
as one matmul, oneDNN's float32 matmuls, and the output projection at the real target tokens only);
transformers runs `model(input_ids, attention_mask, labels=...)` and backpropagates its loss (the same number).
Train mode, dropout 0.1 on both sides, fp32 (or `--dtype bf16`: autocast on both sides), torch's default thread
count. bertkit's model is initialised from a seed, written with `save_pretrained` and loaded by transformers'
`from_pretrained`; the eval-mode logits of both are checked to agree before anything is timed.

Batches (`--batch`), inputs of up to S = --seq-len tokens and targets of up to T = random_spans_helper(S)'s target
length (T5's span-corruption shapes: S 512 -> T 114, S 128 -> T 29):
    varlen  random pieces, lengths uniform in [16, S] for the inputs and [2, T] for the targets (stratified: the midpoints of
            B equal slices in random order), each batch padded to its longest row, as text-to-text fine-tuning
            and packed-less span corruption give them
    dense   every row S input and T target tokens (span corruption of packed text)
    wikitext  real text: T5's span corruption of WikiText-2 paragraphs (wiki.valid.raw lines, headings included,
            each cut to the raw length that gives S input tokens), as unpacked span corruption of lines gives them
    sst2    real text to text: SST-2 training sentences as "sst2 sentence: ..." -> "positive" / "negative"
(real text is split by the cased BERT WordPiece vocabulary of --data, 28,996 pieces, about the granularity of T5's
32k SentencePiece vocabulary, sentinels counted down from id 32099 as T5's are; the model keeps T5's 32,128 rows)
`--batches` distinct batches are cycled, the same ones on both sides, alternated bertkit, transformers, bertkit, ...
over the timed rounds (bench/common.py `time_alternating`). Tokens/s counts real tokens, inputs and targets.

Prints one JSON line per (preset, seq_len, batch kind); ratio = bertkit / transformers tokens/s (> 1: bertkit is
faster), also ratio_best from the fastest round of each batch.

    python bench/bench_t5.py [--preset mini small] [--seq-len 128 512] [--batch varlen dense] [--batch-size N]
                             [--batches N] [--iters N] [--warmup N] [--dtype fp32|bf16] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import numpy as np
import torch

try:  # `python bench/bench_t5.py` puts bench/ on sys.path; `bench.` when imported from the repository root
    from bench.common import emit, log, machine, precision, time_alternating
except ImportError:
    from common import emit, log, machine, precision, time_alternating

VOCAB_SIZE = 32128  # the released T5 checkpoints' (32,100 ids padded to a multiple of 128)
PAD, EOS, FIRST_ID = 0, 1, 3  # T5's <pad>, </s>; ordinary pieces from id 3 on
FIRST_SENTINEL = 32099  # T5's <extra_id_0>
MIN_INPUT, MIN_TARGET = 16, 2
# Rows per batch at seq_len 128 (scaled by 128 / seq_len for longer ones): a step of a second or a few on 2 CPU cores.
DEFAULT_BATCH_SIZE = {"tiny": 32, "mini": 16, "small": 8, "base": 4, "large": 2}
ADAMW = dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, fused=True)


def stratified(low: int, high: int, rows: int, rng: np.random.Generator) -> list[int]:
    """The midpoints of `rows` equal slices of [low, high], in random order (a small batch still has the mean)."""
    edges = np.linspace(low, high + 1, rows + 1)
    mids = np.floor((edges[:-1] + edges[1:]) / 2).astype(int).clip(low, high)
    return [int(x) for x in rng.permutation(mids)]


def text_pairs(kind: str, count: int, seq_len: int, data: str, seed: int) -> list[tuple[list[int], list[int]]]:
    """`count` (input ids, target ids) of real text, each ending with EOS: see the module docstring."""
    from pathlib import Path

    from bertkit.data.spans import random_spans_helper, span_corruption
    from bertkit.tokenizers import WordPieceTokenizer

    rng = np.random.default_rng(seed)
    tokenizer = WordPieceTokenizer.from_vocab(Path(data) / "vocab" / "bert-base-cased-vocab.txt", lowercase=False)
    if kind == "sst2":
        lines = (Path(data) / "glue" / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
        rows = [lines[i].split("\t") for i in rng.choice(len(lines), count, replace=False)]
        sources = tokenizer.encode_plain([f"sst2 sentence: {sentence}" for sentence, _ in rows])
        targets = tokenizer.encode_plain(["positive" if label == "1" else "negative" for _, label in rows])
        return [(ids[:seq_len - 1] + [EOS], target + [EOS]) for ids, target in zip(sources, targets)]
    lines = [line for line in (Path(data) / "wikitext-2" / "wiki.valid.raw").read_text(encoding="utf-8").splitlines()
             if line.strip()]
    raw_length = random_spans_helper(seq_len)[0]
    pairs = []
    for ids in tokenizer.encode_plain([lines[i] for i in rng.choice(len(lines), count, replace=False)]):
        inputs, targets = span_corruption(np.array(ids[:raw_length], dtype=np.int64), rng, FIRST_SENTINEL, EOS)
        pairs.append((inputs.tolist(), targets.tolist()))
    return pairs


def make_batches(kind: str, count: int, rows: int, seq_len: int, target_len: int, vocab_size: int,
                 seed: int, data: str = "") -> list[dict]:
    """`count` batches: input_ids / attention_mask (B, S'), labels (B, T') padded with -100, each row ending with
    EOS; S', T' the batch's longest rows. Random pieces (varlen, dense) or real text (wikitext, sst2)."""
    rng = np.random.default_rng(seed)
    pairs = text_pairs(kind, count * rows, seq_len, data, seed) if kind in ("wikitext", "sst2") else None
    batches = []
    for b in range(count):
        if pairs is not None:
            chunk = pairs[b * rows:(b + 1) * rows]
            S, T = max(len(x) for x, _ in chunk), max(len(y) for _, y in chunk)
            ids = torch.full((rows, S), PAD, dtype=torch.long)
            mask = torch.zeros(rows, S, dtype=torch.long)
            labels = torch.full((rows, T), -100, dtype=torch.long)
            for r, (x, y) in enumerate(chunk):
                ids[r, :len(x)], mask[r, :len(x)], labels[r, :len(y)] = torch.tensor(x), 1, torch.tensor(y)
            batches.append({"input_ids": ids, "attention_mask": mask, "labels": labels,
                            "tokens": sum(len(x) + len(y) for x, y in chunk)})
            continue
        if kind == "dense":
            inputs, targets = [seq_len] * rows, [target_len] * rows
        else:
            inputs = stratified(MIN_INPUT, seq_len, rows, rng)
            targets = stratified(MIN_TARGET, target_len, rows, rng)
        S, T = max(inputs), max(targets)
        ids = torch.full((rows, S), PAD, dtype=torch.long)
        mask = torch.zeros(rows, S, dtype=torch.long)
        labels = torch.full((rows, T), -100, dtype=torch.long)
        for r, (n, m) in enumerate(zip(inputs, targets)):
            ids[r, :n] = torch.from_numpy(rng.integers(FIRST_ID, vocab_size - 100, n))
            ids[r, n - 1] = EOS
            mask[r, :n] = 1
            labels[r, :m] = torch.from_numpy(rng.integers(FIRST_ID, vocab_size, m))
            labels[r, m - 1] = EOS
        batches.append({"input_ids": ids, "attention_mask": mask, "labels": labels,
                        "tokens": sum(inputs) + sum(targets)})
    return batches


def model_pair(preset: str, vocab_size: int, seed: int):
    """(bertkit T5ForConditionalGeneration, transformers' loaded from its directory): T5 1.0 (ReLU, tied), the
    preset's sizes, dropout 0.1."""
    import transformers

    from bertkit.config import T5Config
    from bertkit.models import T5ForConditionalGeneration

    torch.manual_seed(seed)
    ours = T5ForConditionalGeneration(T5Config.preset(preset, vocab_size=vocab_size, dropout_rate=0.1))
    with tempfile.TemporaryDirectory() as directory:
        ours.save_pretrained(directory)
        peer = transformers.T5ForConditionalGeneration.from_pretrained(directory)
    return ours, peer


def check_same_function(ours, peer, batch: dict, rows: int = 2, atol: float = 1e-4) -> None:
    """Eval-mode logits of the first rows agree (the two are the same model before anything is timed)."""
    ours.eval(), peer.eval()
    ids, mask, labels = (batch[k][:rows] for k in ("input_ids", "attention_mask", "labels"))
    with torch.no_grad():
        a = ours(ids, mask, labels=labels).logits
        b = peer(input_ids=ids, attention_mask=mask, labels=labels).logits
    keep = labels != -100
    diff = float((a[keep] - b[keep]).abs().max())
    if diff > atol:
        raise SystemExit(f"bertkit and transformers disagree before timing: max |logit diff| {diff:.2e}")
    ours.train(), peer.train()


def run(presets: list[str], seq_lens: list[int], kinds: list[str], batch_size: int | None, count: int, iters: int,
        warmup: int, seed: int, dtype: str, vocab_size: int, data: str):
    from bertkit.data.spans import random_spans_helper
    from bertkit.training.objectives import SpanCorruptionObjective

    objective = SpanCorruptionObjective()
    for preset in presets:
        for seq_len in seq_lens:
            target_len = random_spans_helper(seq_len)[1]
            rows = batch_size or max(1, DEFAULT_BATCH_SIZE.get(preset, 4) * 128 // seq_len)
            for kind in kinds:
                # A fresh pair for every configuration: trained steps (with their own dropout draws) part them.
                ours, peer = model_pair(preset, vocab_size, seed)
                optimizers = {"bertkit": torch.optim.AdamW(ours.parameters(), **ADAMW),
                              "transformers": torch.optim.AdamW(peer.parameters(), **ADAMW)}
                batches = make_batches(kind, count, rows, seq_len, target_len, vocab_size, seed, data)
                check_same_function(ours, peer, batches[0])
                position = {"bertkit": 0, "transformers": 0}

                def step(side: str) -> None:
                    batch = batches[position[side] % len(batches)]
                    position[side] += 1
                    optimizer = optimizers[side]
                    optimizer.zero_grad(set_to_none=True)
                    with precision(dtype):
                        if side == "bertkit":
                            out = objective(ours, batch)
                            loss = out["span_loss"][0] / out["span_loss"][1]
                        else:
                            loss = peer(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                        labels=batch["labels"]).loss
                    loss.backward()
                    optimizer.step()

                log(f"{preset} S={seq_len} T={target_len} {kind}: {rows} rows x {count} batches, {warmup} warm-up "
                    f"and {iters} timed rounds per batch")
                times = time_alternating({"bertkit": lambda: step("bertkit"),
                                          "transformers": lambda: step("transformers")},
                                         iters * count, warmup * count)
                tokens = [batches[i % count]["tokens"] for i in range(warmup * count, (warmup + iters) * count)]
                rate = {side: sum(tokens) / sum(times[side]) for side in times}
                # The fastest round of each batch, summed: the least disturbed figure on a shared machine.
                best = {side: sum(min(times[side][i::count]) for i in range(count)) for side in times}
                best_tokens = sum(b["tokens"] for b in batches)
                emit({"bench": "t5_train_step", "preset": preset, "seq_len": seq_len, "target_len": target_len,
                      "batch": kind, "batch_size": rows, "batches": count, "dtype": dtype,
                      "real_token_fraction": round(best_tokens / sum(b["input_ids"].numel() + b["labels"].numel()
                                                                     for b in batches), 3),
                      "bertkit_tokens_per_s": round(rate["bertkit"], 1),
                      "transformers_tokens_per_s": round(rate["transformers"], 1),
                      "ratio": round(rate["bertkit"] / rate["transformers"], 3),
                      "ratio_best": round(best["transformers"] / best["bertkit"], 3),
                      "bertkit_best_tokens_per_s": round(best_tokens / best["bertkit"], 1),
                      "iters": iters, "warmup": warmup, **machine()})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", nargs="+", default=["mini"], metavar="NAME",
                        help="size presets of bertkit.config.T5Config.preset (default: mini; small is t5-small)")
    parser.add_argument("--seq-len", nargs="+", type=int, default=[128], metavar="S",
                        help="longest input; targets up to random_spans_helper(S)'s length (default 128)")
    parser.add_argument("--batch", nargs="+", choices=("varlen", "dense", "wikitext", "sst2"),
                        default=["wikitext", "sst2", "varlen", "dense"],
                        help="varlen: lengths uniform in [16, S] and [2, T]; dense: every row full; wikitext, sst2: "
                             "real text (default all four)")
    parser.add_argument("--data", default="../shared/data",
                        help="the shared data folder (wikitext-2, glue/SST-2, vocab) for the real-text batches")
    parser.add_argument("--batch-size", type=int, default=None, help="rows per batch (default: per preset)")
    parser.add_argument("--batches", type=int, default=4, help="distinct batches, cycled (default 4)")
    parser.add_argument("--iters", type=int, default=None, help="timed rounds per batch and side (default 3)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed rounds per batch first (default 1)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny preset, 1 timed round, 2 batches")
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE, help=f"vocabulary (default {VOCAB_SIZE})")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="fp32, or bf16 autocast on both")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.preset = ["tiny"] if args.preset == ["mini"] else args.preset
        args.batches = min(args.batches, 2)
    iters = args.iters if args.iters is not None else (1 if args.quick else 3)
    warmup = args.warmup if args.warmup is not None else 1
    if iters < 1 or warmup < 0 or args.batches < 1:
        raise SystemExit("--iters and --batches must be at least 1, --warmup at least 0")
    run(args.preset, args.seq_len, args.batch, args.batch_size, args.batches, iters, warmup, args.seed, args.dtype,
        args.vocab_size, args.data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
