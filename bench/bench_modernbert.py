"""Benchmark: bertkit's ModernBERT against transformers', on identical weights; and classic BERT-base against a
ModernBERT-base-shaped encoder at equal real tokens.

Two parts, every figure from interleaved timing in one process (bench/common.py `time_alternating`: warm-up, then
rounds A, B, A, B, ...; medians; ratio = bertkit / transformers throughput, > 1: bertkit is faster):

  parity    bertkit's ModernBertModel / ModernBertForMaskedLM against transformers' on the same weights (bertkit's
            model written with `save_pretrained`, read by transformers' `from_pretrained`, default attention
            implementation; outputs checked to agree before timing).
              inference  a forward pass of the bare encoder, eval mode, no_grad
              train      one MLM training step: zero_grad, forward with labels, backward, AdamW step (fused). Both
                         sides project to the vocabulary at the masked positions only (bertkit's `predict_at`,
                         transformers' `sparse_prediction=True`, what ModernBERT's own training does)
  classic   bertkit's BERT-base (the paper's shape: L12 H768, learned positions, table grown to T when T > 512)
            against transformers' ModernBERT-base shape (L22 H768, GeGLU 1152) on the same batches, so the same
            real tokens: what moving from a classic encoder to a ModernBERT-shaped one costs per token, with
            bertkit's ModernBERT-base beside them (`ratio_modernbert`: bertkit ModernBERT / transformers ModernBERT).
            ratio = bertkit BERT-base / transformers ModernBERT-base.

Batches (common.make_batch): `dense`, every row T real tokens; `varlen`, real lengths uniform in [16, T], padded
(attention_mask 0) to T; 30% of the real non-special tokens masked (ModernBERT's rate). Lengths T 128, 512 and 2048
by default: at 2048 the local layers' 128-token window and the global layers' full attention both matter. Rows per
batch keep the tokens per batch about constant (DEFAULT_BATCH_SIZE at T = 128, scaled by 128 / T).

Prints one JSON line per (part, mode, preset, T, batch kind).

    python bench/bench_modernbert.py [--part parity classic] [--mode inference train] [--preset mini base]
                                     [--seq-len 128 512 2048] [--batch dense varlen] [--batch-size N]
                                     [--iters N] [--warmup N] [--dtype fp32|bf16] [--device cpu|cuda] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile

import torch

try:  # `python bench/bench_modernbert.py` puts bench/ on sys.path; `bench.` when imported from the repo root
    from bench.common import (CLS_ID, IGNORE_INDEX, PAD_ID, SEP_ID, VOCAB_SIZE, emit, log, machine, make_batch,
                              rates, time_alternating)
except ImportError:
    from common import (CLS_ID, IGNORE_INDEX, PAD_ID, SEP_ID, VOCAB_SIZE, emit, log, machine, make_batch, rates,
                        time_alternating)

# Rows per batch at T = 128 (scaled by 128 / T): a call of about a second on 2 CPU cores for inference.
DEFAULT_BATCH_SIZE = {"tiny": 64, "mini": 16, "small": 8, "base": 4, "large": 2}
ADAMW = dict(lr=1e-4, betas=(0.9, 0.98), eps=1e-6, weight_decay=1e-5, fused=True)
MASK_PROB = 0.3


def rows_for(preset: str, seq_len: int, explicit: int | None) -> int:
    return explicit if explicit is not None else max(1, DEFAULT_BATCH_SIZE.get(preset, 1) * 128 // seq_len)


def modernbert_config(preset: str, max_len: int):
    """A ModernBERT config of MODERNBERT_PRESETS' `preset` on Google's BERT vocabulary (the batches' ids)."""
    from bertkit.config import ModernBertConfig

    return ModernBertConfig.preset(preset, vocab_size=VOCAB_SIZE, pad_token_id=PAD_ID, cls_token_id=CLS_ID,
                                   bos_token_id=CLS_ID, sep_token_id=SEP_ID, eos_token_id=SEP_ID,
                                   max_position_embeddings=max(8192, max_len))


def modernbert_pair(preset: str, mlm: bool, max_len: int, seed: int, device: torch.device):
    """(bertkit model, transformers model) of identical weights: ModernBertForMaskedLM (mlm) or ModernBertModel."""
    import transformers

    from bertkit.models import ModernBertForMaskedLM, ModernBertModel

    config = modernbert_config(preset, max_len)
    torch.manual_seed(seed)
    ours = (ModernBertForMaskedLM if mlm else ModernBertModel)(config)
    peer_cls = transformers.ModernBertForMaskedLM if mlm else transformers.ModernBertModel
    with tempfile.TemporaryDirectory() as tmp:
        ours.save_pretrained(tmp)
        peer = peer_cls.from_pretrained(tmp)
    if mlm:  # the vocabulary projection at the masked positions only, as bertkit's predict_at
        peer.config.sparse_prediction = True
        peer.sparse_prediction = True
    return ours.to(device), peer.to(device)


def bert_base(mlm: bool, max_len: int, seed: int, device: torch.device):
    from bertkit import BertConfig
    from bertkit.models import BertForMaskedLM, BertModel

    config = BertConfig.preset("base", vocab_size=VOCAB_SIZE, max_position_embeddings=max(512, max_len))
    torch.manual_seed(seed)
    return (BertForMaskedLM(config) if mlm else BertModel(config, add_pooler=False)).to(device)


def on(batch, device: torch.device) -> dict[str, torch.Tensor]:
    return {"input_ids": batch.input_ids.to(device), "attention_mask": batch.attention_mask.to(device),
            "token_type_ids": batch.token_type_ids.to(device), "labels": batch.labels.to(device)}


def autocast(dtype: str, device: torch.device):
    if dtype == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def synced(fn, device: torch.device):
    """`fn` that returns only when its work is done (CUDA runs asynchronously)."""
    if device.type != "cuda":
        return fn

    def call():
        fn()
        torch.cuda.synchronize(device)
    return call


def infer(model, tensors: dict, dtype: str, device: torch.device, kind: str) -> None:
    """A forward pass of an encoder; kind: "bertkit" (any bertkit encoder), "transformers" (no token types)."""
    with torch.no_grad(), autocast(dtype, device):
        if kind == "transformers":
            model(input_ids=tensors["input_ids"], attention_mask=tensors["attention_mask"])
        else:
            model(tensors["input_ids"], tensors["attention_mask"], tensors["token_type_ids"])


def step(model, optimizer, tensors: dict, dtype: str, device: torch.device, kind: str) -> torch.Tensor:
    """One MLM training step (sparse prediction on both sides); returns the loss."""
    optimizer.zero_grad(set_to_none=True)
    labels = tensors["labels"]
    with autocast(dtype, device):
        if kind == "transformers":
            loss = model(input_ids=tensors["input_ids"], attention_mask=tensors["attention_mask"],
                         labels=labels).loss
        else:
            loss = model(tensors["input_ids"], tensors["attention_mask"], tensors["token_type_ids"], labels=labels,
                         predict_at=labels != IGNORE_INDEX).loss
    loss.backward()
    optimizer.step()
    return loss.detach()


@torch.no_grad()
def check_parity(ours, peer, tensors: dict, mlm: bool, rows: int = 2, atol: float = 1e-4) -> None:
    """Refuse to time two models that do not compute the same thing (eval mode, fp32, a few rows)."""
    ours.eval(), peer.eval()
    ids, mask = tensors["input_ids"][:rows], tensors["attention_mask"][:rows]
    if mlm:
        labels = tensors["labels"][:rows]
        a = ours(ids, mask, labels=labels, predict_at=labels != IGNORE_INDEX)
        b = peer(input_ids=ids, attention_mask=mask, labels=labels)
        pairs = [(a.prediction_logits, b.logits), (a.loss, b.loss)]
    else:
        real = mask.bool()
        pairs = [(ours(ids, mask).last_hidden_state[real], peer(input_ids=ids, attention_mask=mask)
                  .last_hidden_state[real])]
    for x, y in pairs:
        diff = (x.float() - y.float()).abs().max().item()
        if diff > atol:
            raise SystemExit(f"bertkit and transformers disagree on identical weights (max |diff| {diff:.2e}); "
                             f"the benchmark would compare different computations")


def run_parity(args, device, iters, warmup) -> list[dict]:
    results = []
    for mode in args.mode:
        mlm = mode == "train"
        for preset in args.preset:
            ours, peer = modernbert_pair(preset, mlm, max(args.seq_len), args.seed, device)
            optimizers = {}
            if mlm:
                optimizers = {"bertkit": torch.optim.AdamW(ours.parameters(), **ADAMW),
                              "transformers": torch.optim.AdamW(peer.parameters(), **ADAMW)}
            for seq_len in args.seq_len:
                for kind in args.batch:
                    rows = rows_for(preset, seq_len, args.batch_size)
                    batch = make_batch(kind, rows, seq_len, seed=args.seed, mask_prob=MASK_PROB)
                    tensors = on(batch, device)
                    if device.type == "cpu" or args.dtype == "fp32":
                        check_parity(ours, peer, tensors, mlm)
                    if mlm:
                        ours.train(), peer.train()
                        fns = {"transformers": lambda: step(peer, optimizers["transformers"], tensors, args.dtype,
                                                            device, "transformers"),
                               "bertkit": lambda: step(ours, optimizers["bertkit"], tensors, args.dtype, device,
                                                       "bertkit")}
                    else:
                        ours.eval(), peer.eval()
                        fns = {"transformers": lambda: infer(peer, tensors, args.dtype, device, "transformers"),
                               "bertkit": lambda: infer(ours, tensors, args.dtype, device, "bertkit")}
                    log(f"parity {mode} {preset} T={seq_len} {kind} B={rows}: {warmup} warm-up + {iters} rounds")
                    times = time_alternating({k: synced(f, device) for k, f in fns.items()}, iters, warmup)
                    record = {"bench": "modernbert", "part": "parity", "mode": mode, "preset": preset,
                              "seq_len": seq_len, "batch": kind, "batch_size": rows, "dtype": args.dtype,
                              "device": str(device)}
                    record.update(rates(times, batch.real_tokens, "tokens_per_s", "call_s"))
                    record.pop("_median_s", None)
                    record.update(real_tokens=batch.real_tokens, iters=iters)
                    results.append(record)
                    emit(record)
    return results


def run_classic(args, device, iters, warmup) -> list[dict]:
    """BERT-base (bertkit) against ModernBERT-base (transformers, and bertkit beside it) on the same batches."""
    results = []
    for mode in args.mode:
        mlm = mode == "train"
        bert = bert_base(mlm, max(args.seq_len), args.seed, device)
        ours, peer = modernbert_pair("base", mlm, max(args.seq_len), args.seed, device)
        models = {"bertkit": (bert, "bertkit"), "transformers": (peer, "transformers"),
                  "bertkit_modernbert": (ours, "bertkit")}
        optimizers = {name: torch.optim.AdamW(m.parameters(), **ADAMW) for name, (m, _) in models.items()} \
            if mlm else {}
        for seq_len in args.seq_len:
            for kind in args.batch:
                rows = rows_for("base", seq_len, args.batch_size)
                batch = make_batch(kind, rows, seq_len, seed=args.seed, mask_prob=MASK_PROB)
                tensors = on(batch, device)
                fns = {}
                for name, (model, side) in models.items():
                    model.train(mlm)
                    if mlm:
                        fns[name] = (lambda m=model, s=side, o=optimizers[name]:
                                     step(m, o, tensors, args.dtype, device, s))
                    else:
                        fns[name] = lambda m=model, s=side: infer(m, tensors, args.dtype, device, s)
                log(f"classic {mode} BERT-base vs ModernBERT-base T={seq_len} {kind} B={rows}: {warmup} warm-up + "
                    f"{iters} rounds")
                times = time_alternating({k: synced(f, device) for k, f in fns.items()}, iters, warmup)
                record = {"bench": "modernbert", "part": "classic", "mode": mode, "preset": "base",
                          "seq_len": seq_len, "batch": kind, "batch_size": rows, "dtype": args.dtype,
                          "device": str(device), "bertkit": "BERT-base (bertkit)",
                          "transformers": "ModernBERT-base (transformers)"}
                record.update(rates(times, batch.real_tokens, "tokens_per_s", "call_s"))
                record.pop("_median_s", None)
                record.update(real_tokens=batch.real_tokens, iters=iters)
                results.append(record)
                emit(record)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", nargs="+", choices=("parity", "classic"), default=["parity", "classic"])
    parser.add_argument("--mode", nargs="+", choices=("inference", "train"), default=["inference", "train"])
    parser.add_argument("--preset", nargs="+", default=["mini", "base"], metavar="NAME",
                        help="parity part: ModernBERT size presets (tiny, mini, small, base, large; default mini "
                             "base); the classic part is always base")
    parser.add_argument("--seq-len", nargs="+", type=int, default=[128, 512, 2048], metavar="T")
    parser.add_argument("--batch", nargs="+", choices=("dense", "varlen"), default=["dense", "varlen"])
    parser.add_argument("--batch-size", type=int, default=None, help="rows per batch (default: DEFAULT_BATCH_SIZE)")
    parser.add_argument("--iters", type=int, default=None, help="timed rounds per side (default 5)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed rounds first (default 1)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 timed round, 1 warm-up")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    iters = args.iters if args.iters is not None else (1 if args.quick else 5)
    warmup = args.warmup if args.warmup is not None else 1
    device = torch.device(args.device)
    log(f"machine: {machine()}")
    if "parity" in args.part:
        run_parity(args, device, iters, warmup)
    if "classic" in args.part:
        run_classic(args, device, iters, warmup)
    return 0


if __name__ == "__main__":
    sys.exit(main())
