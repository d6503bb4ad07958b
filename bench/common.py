"""Shared pieces of the peer-vs-bertkit benchmarks: peak FLOP/s, the alternating timing loop, model FLOPs and MFU,
synthetic BERT batches, identical-weight model pairs, and the JSON line every benchmark prints.

House rule (bench/README.md): the peer (transformers) and bertkit run in the same process, on identical weights
and data, alternated ABAB... over timed iterations after warm-up; the median is reported and
ratio = bertkit / peer (> 1 means bertkit is faster).

Import it as `from common import ...` when a script is run as `python bench/<script>.py` (its folder is then on
sys.path), or as `bench.common` from the repository root.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

# Google's BERT vocabulary: special ids, and the first id of an ordinary word piece (0..998 are [PAD]/[unused]).
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = 0, 100, 101, 102, 103
FIRST_WORD_ID = 999
VOCAB_SIZE = 30522
IGNORE_INDEX = -100
MIN_VARLEN = 16  # shortest real length of a `varlen` row


# ------------------------------------------------------------------------------------------------------------------
# Machine
# ------------------------------------------------------------------------------------------------------------------
class PeakMeter:
    """The best matmul rate (fp32, or bf16 for bf16 runs) seen over several short measurements spread through a run.

    On a shared machine one measurement may land in a busy moment; sampling again between configurations and
    keeping the best makes the MFU denominator a property of the hardware, not of the neighbours.
    """

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        self.gflops = 0.0
        self.dtype = dtype

    def measure(self, seconds: float) -> float:
        self.gflops = max(self.gflops, measure_peak_gflops(seconds, dtype=self.dtype))
        return self.gflops


def measure_peak_gflops(seconds: float = 2.0, n: int = 2048, dtype: torch.dtype = torch.float32) -> float:
    """Achievable matmul rate of this machine in `dtype`, GFLOP/s: the best of repeated n x n products for ~`seconds`,
    each timed through torch's default kernel (`torch.mm`) and, in fp32, through bertkit's `linear` (oneDNN's
    kernel where torch has it; on AVX-512 CPUs not made by Intel it is about twice as fast as MKL's).

    Uses torch's current thread count (never changed here), so it is the ceiling the models run under.
    The best single product is taken rather than the mean because, on a shared machine, other work only ever
    slows a product down; the best is the closest to what the hardware can do.
    """
    from bertkit.models import linear

    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(dtype)
    b = torch.randn(n, n, generator=g).to(dtype)
    out = torch.empty(n, n, dtype=dtype)
    kernels = [lambda: torch.mm(a, b, out=out)]
    if dtype == torch.float32:
        kernels.append(lambda: linear(a, b))  # a @ b.T: the same FLOPs
    best = 0.0
    for kernel in kernels:
        kernel()  # warm-up: first-call allocation and kernel selection
        deadline = time.perf_counter() + seconds / len(kernels)
        while True:
            start = time.perf_counter()
            kernel()
            elapsed = time.perf_counter() - start
            best = max(best, 2 * n**3 / elapsed / 1e9)
            if start + elapsed >= deadline:
                break
    return best


def machine() -> dict:
    """What a figure was measured on, for the JSON line and the README table."""
    import transformers

    return {"cpu": _cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version()}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# ------------------------------------------------------------------------------------------------------------------
# Timing
# ------------------------------------------------------------------------------------------------------------------
def time_alternating(fns: dict[str, Callable[[], object]], iters: int, warmup: int) -> dict[str, list[float]]:
    """Run every function `warmup` times, then `iters` timed rounds A, B, A, B, ...; seconds per call, by name.

    Alternation spreads slow phases of a shared machine (another job, thermal state) over both sides instead of
    pinning them on whichever ran second. Each function must do its whole unit of work before returning (CPU:
    nothing is asynchronous).
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(iters):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def median(values: list[float]) -> float:
    return statistics.median(values)


# ------------------------------------------------------------------------------------------------------------------
# FLOPs
# ------------------------------------------------------------------------------------------------------------------
def non_embedding_parameters(config) -> int:
    """Parameters that multiply every token's activations: encoder layers, MLM transform, pooler, NSP.

    Word, position and token-type tables are lookups, not matmuls, and the tied MLM decoder is counted separately
    (`H x V` in `model_flops`). LayerNorm and bias terms are included; they are < 1% and the standard formula
    (Kaplan et al. 2020) counts every non-embedding parameter.
    """
    H, I, L = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    layer = 4 * (H * H + H) + (H * I + I) + (I * H + H) + 2 * 2 * H  # Q, K, V, out; up; down; two LayerNorms
    mlm_transform = H * H + H + 2 * H
    pooler, nsp = H * H + H, 2 * H + 2
    return L * layer + mlm_transform + pooler + nsp


def model_flops(config, lengths: list[int], training: bool, mlm_head: bool = True) -> float:
    """Model FLOPs of one step over sequences of real lengths `lengths` (padding does no useful work).

    Per real token of a sequence of real length T (PaLM, Chowdhery et al. 2022, appendix B):
        forward   2 x N  +  4 x L x H x T       N = non-embedding parameters (+ H x V for the MLM decoder)
        training  6 x N  + 12 x L x H x T       backward = 2 x forward
    The attention term counts QK^T and (probs)V: 2 matmuls x 2 FLOPs x T x H per layer. With the MLM head,
    N includes the decoder H x V (tied to the word embeddings, so not a non-embedding parameter, but a real
    matmul at every position: both implementations decode every position, not only the masked ones).
    The pooler and NSP act on one vector per sequence; they are counted per token as the formula does (< 1%).
    """
    N = non_embedding_parameters(config)
    if mlm_head:
        N += config.hidden_size * config.vocab_size
    else:  # bare encoder: no MLM transform, no NSP
        H = config.hidden_size
        N -= (H * H + H + 2 * H) + (2 * H + 2)
    per_param, per_attn = (6, 12) if training else (2, 4)
    L, H = config.num_hidden_layers, config.hidden_size
    return float(sum(per_param * N * T + per_attn * L * H * T * T for T in lengths))


def mfu(flops_per_step: float, seconds_per_step: float, peak_gflops: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the measured matmul peak."""
    return flops_per_step / seconds_per_step / (peak_gflops * 1e9)


def rates(times: dict[str, list[float]], units: float, rate_name: str, time_name: str | None) -> dict:
    """Result fields from `time_alternating`'s "bertkit" and "transformers" timings of work of `units` units.

    Always the two median rates (`bertkit_<rate_name>`, `transformers_<rate_name>`). With `time_name`, also
    ratio (median rate bertkit / transformers, > 1: bertkit faster), ratio_best (the same from the fastest
    rounds, the least disturbed on a shared machine), the median and best seconds of each side.
    """
    t_ours, t_peer = median(times["bertkit"]), median(times["transformers"])
    out = {f"bertkit_{rate_name}": round(units / t_ours, 2), f"transformers_{rate_name}": round(units / t_peer, 2)}
    if time_name is not None:
        best_ours, best_peer = min(times["bertkit"]), min(times["transformers"])
        out.update({"ratio": round(t_peer / t_ours, 3), "ratio_best": round(best_peer / best_ours, 3),
                    f"bertkit_{time_name}": round(t_ours, 4), f"transformers_{time_name}": round(t_peer, 4),
                    "bertkit_min_s": round(best_ours, 4), "transformers_min_s": round(best_peer, 4),
                    "_median_s": (t_ours, t_peer)})
    for name in times:  # further bertkit variants (e.g. "bertkit_sparse"): their rate and ratio to the peer
        if name not in ("bertkit", "transformers"):
            t_variant = median(times[name])
            out[f"{name}_{rate_name}"] = round(units / t_variant, 2)
            out[f"ratio_{name.removeprefix('bertkit_')}"] = round(t_peer / t_variant, 3)
    return out


def add_mfu(record: dict, flops: float, peak_gflops: float) -> dict:
    """`record` with bertkit_mfu, transformers_mfu and peak_gflops inserted after the ratios (from its medians)."""
    t_ours, t_peer = record["_median_s"]
    out = {}
    for key, value in record.items():
        if key == "_median_s":
            continue
        out[key] = value
        if key == "ratio_best":
            out.update(bertkit_mfu=round(mfu(flops, t_ours, peak_gflops), 4),
                       transformers_mfu=round(mfu(flops, t_peer, peak_gflops), 4),
                       peak_gflops=round(peak_gflops, 1))
    return out


# ------------------------------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------------------------------
@dataclass
class Batch:
    """A synthetic pretraining batch in Google's vocabulary. Tensors are (B, T) int64 except `nsp_labels` (B,)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor
    labels: torch.Tensor  # original id at masked positions, IGNORE_INDEX elsewhere
    nsp_labels: torch.Tensor
    lengths: list[int]  # real tokens per row, specials included

    @property
    def real_tokens(self) -> int:
        return sum(self.lengths)


def make_batch(kind: str, batch_size: int, seq_len: int, seed: int = 0, vocab_size: int = VOCAB_SIZE,
               mask_prob: float = 0.15) -> Batch:
    """`[CLS] A [SEP] B [SEP]` rows of random word pieces, masked for MLM, with random NSP labels.

    kind: "dense" (every row seq_len real tokens) or "varlen" (real lengths uniform in [16, seq_len], then [PAD]
    with attention_mask 0 up to seq_len). The varlen lengths are stratified, the midpoints of B equal slices of
    [16, seq_len] in random order, so that even a small batch has the mean length of the distribution and
    tokens/s is not at the mercy of two or three draws. MLM: exactly round(mask_prob x candidates) real
    non-special positions per row become [MASK] (labels hold the original ids); 80/10/10 changes nothing about cost.
    """
    if kind not in ("dense", "varlen"):
        raise ValueError(f"batch kind must be 'dense' or 'varlen', got {kind!r}")
    if seq_len < MIN_VARLEN:
        raise ValueError(f"seq_len must be at least {MIN_VARLEN}")
    g = torch.Generator().manual_seed(seed)
    if kind == "dense":
        lengths = [seq_len] * batch_size
    else:
        span = seq_len - MIN_VARLEN + 1  # lengths 16..seq_len, each slice of it equally likely
        order = torch.randperm(batch_size, generator=g).tolist()
        lengths = [MIN_VARLEN + int(span * (i + 0.5) / batch_size) for i in order]
    ids = torch.full((batch_size, seq_len), PAD_ID, dtype=torch.long)
    mask = torch.zeros(batch_size, seq_len, dtype=torch.long)
    types = torch.zeros(batch_size, seq_len, dtype=torch.long)
    labels = torch.full((batch_size, seq_len), IGNORE_INDEX, dtype=torch.long)
    for row, n in enumerate(lengths):
        sep = int(torch.randint(2, n - 2, (1,), generator=g))  # [CLS] A(1..sep-1) [SEP] B [SEP]; both non-empty
        ids[row, :n] = torch.randint(FIRST_WORD_ID, vocab_size, (n,), generator=g)
        ids[row, 0], ids[row, sep], ids[row, n - 1] = CLS_ID, SEP_ID, SEP_ID
        mask[row, :n] = 1
        types[row, sep + 1:n] = 1
        candidates = torch.tensor([i for i in range(1, n - 1) if i != sep])
        chosen = candidates[torch.randperm(len(candidates), generator=g)[:max(1, round(mask_prob * len(candidates)))]]
        labels[row, chosen] = ids[row, chosen]
        ids[row, chosen] = MASK_ID
    nsp = torch.randint(0, 2, (batch_size,), generator=g)
    return Batch(ids, mask, types, labels, nsp, lengths)


# ------------------------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------------------------
def model_pair(preset: str, pretraining: bool, seed: int = 0, vocab_size: int = VOCAB_SIZE):
    """(bertkit model, transformers model) with identical weights, both fp32 on CPU.

    bertkit's model is initialised from `seed`, written with `save_pretrained` and read back by transformers'
    `from_pretrained` with its default attention implementation, as a user of either library would.
    """
    import transformers

    from bertkit import BertConfig, BertForPreTraining, BertModel

    config = BertConfig.preset(preset, vocab_size=vocab_size)
    torch.manual_seed(seed)
    ours = BertForPreTraining(config) if pretraining else BertModel(config)
    peer_cls = transformers.BertForPreTraining if pretraining else transformers.BertModel
    with tempfile.TemporaryDirectory() as tmp:
        ours.save_pretrained(tmp)
        peer = peer_cls.from_pretrained(tmp)
    return config, ours, peer


@torch.no_grad()
def check_same_function(ours, peer, batch: Batch, pretraining: bool, rows: int = 2, atol: float = 1e-4) -> None:
    """Refuse to time two models that do not compute the same thing: compare eval-mode outputs on a few rows."""
    ours.eval(), peer.eval()
    args = dict(input_ids=batch.input_ids[:rows], attention_mask=batch.attention_mask[:rows],
                token_type_ids=batch.token_type_ids[:rows])
    a, b = ours(**args), peer(**args)
    pairs = ([(a.prediction_logits, b.prediction_logits), (a.seq_relationship_logits, b.seq_relationship_logits)]
             if pretraining else [(a.last_hidden_state, b.last_hidden_state), (a.pooler_output, b.pooler_output)])
    for x, y in pairs:
        real = batch.attention_mask[:rows].bool()
        if x.dim() == 3:  # padded positions are garbage in both; compare real ones
            x, y = x[real], y[real]
        diff = (x - y).abs().max().item()
        if diff > atol:
            raise SystemExit(f"bertkit and transformers disagree on identical weights (max |diff| {diff:.2e}); "
                             f"the benchmark would compare different computations")


# ------------------------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------------------------
def compile_pair(ours, peer) -> None:
    """Regional torch.compile on both sides, alike: every encoder layer, dynamic shapes, inductor."""
    from transformers.models.bert.modeling_bert import BertLayer

    from bertkit.models import compile_layers

    compile_layers(ours)
    for module in peer.modules():
        if isinstance(module, BertLayer):
            module.compile(dynamic=True)


def add_model_bench_args(parser: argparse.ArgumentParser, default_iters: int = 5, default_warmup: int = 1) -> None:
    """Options every model benchmark shares: shapes, batch kinds, iterations, --quick."""
    parser.add_argument("--preset", nargs="+", default=["mini", "base"], metavar="NAME",
                        help="size presets of bertkit.BertConfig.preset (default: mini base)")
    parser.add_argument("--seq-len", nargs="+", type=int, default=[128], metavar="T",
                        help="padded sequence lengths (default: 128; 512 is the other usual one)")
    parser.add_argument("--batch", nargs="+", choices=("dense", "varlen"), default=["dense", "varlen"],
                        help="batch kinds: dense = every row full length; varlen = real lengths uniform in "
                             f"[{MIN_VARLEN}, T], padded (default: both)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="rows per batch (default: per preset and length, see DEFAULT_BATCH_SIZE)")
    parser.add_argument("--iters", type=int, default=None, help=f"timed rounds per side (default {default_iters})")
    parser.add_argument("--warmup", type=int, default=None, help=f"untimed rounds first (default {default_warmup})")
    parser.add_argument("--peak-seconds", type=float, default=None, help="time spent measuring the matmul peak "
                                                                          "(default 2)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 timed rounds, 1 warm-up, 0.5 s peak")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                        help="fp32, or bf16 autocast on both sides (MFU then against the bf16 matmul peak)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the encoder layers of both sides (bertkit: compile_layers; transformers: "
                             "each BertLayer, dynamic shapes), compiled during the warm-up rounds")
    parser.set_defaults(_default_iters=default_iters, _default_warmup=default_warmup)


def model_bench_main(run, description: str, default_iters: int, default_warmup: int,
                     argv: list[str] | None = None) -> int:
    """The command line of a model benchmark: parse the shared options, call `run`, print a JSON line per record."""
    parser = argparse.ArgumentParser(description=description)
    add_model_bench_args(parser, default_iters=default_iters, default_warmup=default_warmup)
    args = parser.parse_args(argv)
    iters, warmup, peak_seconds = resolve_counts(args)
    for record in run(args.preset, args.seq_len, args.batch, args.batch_size, iters, warmup, peak_seconds,
                      args.seed, args.dtype, args.compile):
        emit(record)
    return 0


def resolve_counts(args: argparse.Namespace) -> tuple[int, int, float]:
    """(iters, warmup, peak_seconds) from explicit options, else --quick, else the defaults."""
    iters = args.iters if args.iters is not None else (2 if args.quick else args._default_iters)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else args._default_warmup)
    peak = args.peak_seconds if args.peak_seconds is not None else (0.5 if args.quick else 2.0)
    if iters < 1 or warmup < 0:
        raise SystemExit("--iters must be at least 1 and --warmup at least 0")
    return iters, warmup, peak


def precision(dtype: str):
    """The context a timed call runs in: nothing for fp32, bf16 autocast on the CPU for bf16 (both sides)."""
    import contextlib

    if dtype == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def peak_dtype(dtype: str) -> torch.dtype:
    return torch.bfloat16 if dtype == "bf16" else torch.float32


def batch_size_for(table: dict[str, int], preset: str, seq_len: int, explicit: int | None) -> int:
    """Rows per batch: explicit, else the preset's size at length 128 scaled to keep tokens per batch constant."""
    if explicit is not None:
        return explicit
    return max(1, table.get(preset, 1) * 128 // seq_len)


# ------------------------------------------------------------------------------------------------------------------
# Output
# ------------------------------------------------------------------------------------------------------------------
def emit(record: dict) -> None:
    """Print one JSON line (flushed, so a long run shows its figures as they come)."""
    print(json.dumps(record), flush=True)


def log(message: str) -> None:
    """Progress for humans, on stderr so stdout stays JSON lines."""
    print(message, file=sys.stderr, flush=True)
