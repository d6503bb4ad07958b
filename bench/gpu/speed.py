"""Speed part of the GPU suite: bertkit against transformers on identical weights, in the same run, interleaved.

Every row follows bench/README.md's rules and reuses bench/common.py: weights through `save_pretrained` ->
`from_pretrained`, outputs compared before timing (`check_same_function`), the same synthetic batches
(`make_batch`: `dense`, every row T real tokens; `varlen`, real lengths uniform in [16, T]), A/B rounds alternated
(`time_alternating`), medians and ratios (`rates`), model FLOPs and MFU (`model_flops`, `add_mfu`). What the GPU
adds: both sides under bf16 autocast on the device; a `torch.cuda.synchronize()` closes every timed call (kernels
run asynchronously, so the clock would otherwise stop at the launch); MFU against a bf16 matmul peak measured in
this run (`peak`); peak memory from `torch.cuda.max_memory_allocated` around one lone call per side; batches that
fill the GPU (halved on out-of-memory); torch.compile off and on.

Rows:
- `peak`: the best bf16 matmul rate of n x n products (n 8192 on a GPU), TFLOP/s: the MFU denominator.
- `pretrain_T{128,512}_{dense,varlen}`: one pretraining step of BERT-base (`BertForPreTraining`, MLM + NSP, fused
  AdamW, dropout on): bertkit as its trainer runs it (unpadded, sparse MLM) and with dense MLM logits
  (`ratio_dense_mlm`), transformers (SDPA attention).
- `inference_T{128,512}_{dense,varlen}`: one `BertModel` forward, eval, no_grad.
- `..._T128_{dense,varlen}_compiled`: the same pairs after regional torch.compile of both sides (last: the
  costliest rows, the first a short budget drops). In the quick run T is 32 and 64.
- `modernbert_T{128,512}_varlen`: bertkit's classic BERT-base against transformers' `ModernBertModel` in
  ModernBERT-base's shape (22 layers, local/global attention; random weights, no download) on the same real
  tokens; FlashAttention 2 when `flash_attn` imports, else SDPA.

Goals printed beside each row (the issue's): MFU >= 0.40 for BERT-base T 128 bf16 training; bertkit/transformers
>= 1.5 on dense batches and >= 2.5 on variable-length ones.
"""

from __future__ import annotations

import importlib
import tempfile
import time
from collections.abc import Callable

import torch

from bench.common import (Batch, add_mfu, check_same_function, make_batch, median, mfu, model_flops, rates,
                          time_alternating)
from bench.gpu.context import Context, Skip

GOAL_MFU = 0.40  # BERT-base, T 128, bf16 training
GOAL_RATIO = {"dense": 1.5, "varlen": 2.5}
ADAMW = dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, fused=True)  # as bench_pretrain_step
QUICK_VOCAB = 2048  # the dry run's vocabulary: above make_batch's first word id (999), small enough for a CPU


# ------------------------------------------------------------------------------------------------------------------
# Shapes and sizes
# ------------------------------------------------------------------------------------------------------------------
def bert_config(ctx: Context, **overrides):
    """BERT-base (Google's vocabulary) on a device; hidden 32, 2 layers in the quick run."""
    from bertkit import BertConfig

    if ctx.quick:
        return BertConfig(vocab_size=QUICK_VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, max_position_embeddings=128, **overrides)
    return BertConfig.preset("base", vocab_size=30522, **overrides)


def model_label(ctx: Context) -> str:
    return "tiny H32 L2 (quick)" if ctx.quick else "BERT-base"


def seq_lens(ctx: Context) -> tuple[int, int]:
    return (32, 64) if ctx.quick else (128, 512)


def rows_for(ctx: Context, training: bool, seq_len: int) -> int:
    """Rows per batch: tokens per batch constant over lengths, sized to fill the GPU (256 x 128 tokens per
    training step, 512 x 128 per forward on an 80 GB GPU, scaled by its memory); 4 in the quick run."""
    if ctx.quick:
        return 4
    base = 256 if training else 512
    if ctx.cuda:
        gib = torch.cuda.get_device_properties(ctx.device).total_memory / 2**30
        scale = 1
        while gib < 70 / scale and scale < 16:  # halve per halving of memory below 80 GB
            scale *= 2
        base //= scale
    return max(1, base * 128 // seq_len)


def timing_rounds(ctx: Context, compiled: bool) -> tuple[int, int]:
    """(timed rounds, warm-up rounds) per side."""
    if ctx.quick:
        return 2, 1
    return (10, 3) if not compiled else (10, 2)


# ------------------------------------------------------------------------------------------------------------------
# Device helpers
# ------------------------------------------------------------------------------------------------------------------
def measure_peak(ctx: Context, dtype: torch.dtype = torch.bfloat16, seconds: float | None = None) -> float:
    """The best rate of n x n matmuls in `dtype` on the device, GFLOP/s (n 8192 on a GPU, 256 in the quick run).

    Products are timed in groups of 10 between synchronisations (one product on an H100 takes ~1.5 ms, close to
    the launch and sync overheads); the best group over ~`seconds` is kept, as bench/common.py does on the CPU.
    """
    n = 256 if ctx.quick else (8192 if ctx.cuda else 2048)
    seconds = seconds if seconds is not None else (0.3 if ctx.quick else 3.0)
    g = torch.Generator(device=ctx.device).manual_seed(0)
    a = torch.randn(n, n, device=ctx.device, dtype=dtype, generator=g)
    b = torch.randn(n, n, device=ctx.device, dtype=dtype, generator=g)
    out = torch.empty(n, n, device=ctx.device, dtype=dtype)
    group = 10 if ctx.cuda else 1
    for _ in range(3):  # warm-up: kernel selection, clocks up
        torch.mm(a, b, out=out)
    ctx.sync()
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        ctx.sync()
        start = time.perf_counter()
        for _ in range(group):
            torch.mm(a, b, out=out)
        ctx.sync()
        best = max(best, group * 2 * n**3 / (time.perf_counter() - start) / 1e9)
    return best


def synced(ctx: Context, fn: Callable[[], object]) -> Callable[[], None]:
    """`fn` followed by a device synchronisation, so a timer around the call measures the work, not the launch."""
    def call() -> None:
        fn()
        ctx.sync()
    return call


def step_memory_mib(ctx: Context, fn: Callable[[], object]) -> tuple[float | None, float | None]:
    """(peak memory one call allocates beyond what was already allocated, MiB; memory allocated before it, MiB),
    from torch.cuda.max_memory_allocated around a lone call; (None, None) off CUDA."""
    if not ctx.cuda:
        fn()
        return None, None
    ctx.sync()
    before = torch.cuda.memory_allocated(ctx.device)
    torch.cuda.reset_peak_memory_stats(ctx.device)
    fn()
    ctx.sync()
    peak = torch.cuda.max_memory_allocated(ctx.device)
    return round((peak - before) / 2**20, 1), round(before / 2**20, 1)


def on_device(batch: Batch, device: torch.device) -> Batch:
    return Batch(*(t.to(device) for t in (batch.input_ids, batch.attention_mask, batch.token_type_ids,
                                          batch.labels, batch.nsp_labels)), batch.lengths)


def compile_pair(ours, peer, backend: str) -> None:
    """Regional torch.compile on both sides alike (bench/common.py's compile_pair, with the backend chosen):
    bertkit's encoder layers (`compile_layers`), each transformers encoder layer, dynamic shapes."""
    from bertkit.models import compile_layers

    compile_layers(ours, backend=backend)
    layer_types = {"BertLayer", "ModernBertEncoderLayer"}
    for module in peer.modules():
        if type(module).__name__ in layer_types:
            module.compile(dynamic=True, backend=backend)


def with_oom_retry(ctx: Context, measured: dict, rows: int, attempt: Callable[[int], None]) -> None:
    """Run `attempt(rows)`; on CUDA out-of-memory halve the rows and try again (twice at most), noting it."""
    for _ in range(3):
        try:
            attempt(rows)
            return
        except torch.cuda.OutOfMemoryError:
            if rows <= 1:
                raise
            ctx.free_memory()
            measured["note"] = f"out of memory at {rows} rows; halved"
            rows //= 2
    attempt(rows)


# ------------------------------------------------------------------------------------------------------------------
# Models, built once per run
# ------------------------------------------------------------------------------------------------------------------
class Models:
    """The model pairs of the run, built on first use and kept (compile rows reuse the eager pair)."""

    def __init__(self) -> None:
        self.pairs: dict[str, tuple] = {}
        self.peak_gflops: float | None = None

    def pair(self, ctx: Context, kind: str):
        """(config, bertkit model, transformers model[, optimizers]) of `kind` "pretrain", "pretrain_attn0"
        (attention dropout 0) or "inference", on the device, identical weights (bench/common.py's model_pair)."""
        if kind in self.pairs:
            return self.pairs[kind]
        import transformers

        from bertkit import BertForPreTraining, BertModel

        config = bert_config(ctx, **({"attention_probs_dropout_prob": 0.0} if kind == "pretrain_attn0" else {}))
        training = kind.startswith("pretrain")
        torch.manual_seed(0)
        ours = BertForPreTraining(config) if training else BertModel(config)
        peer_cls = transformers.BertForPreTraining if training else transformers.BertModel
        with tempfile.TemporaryDirectory() as tmp:
            ours.save_pretrained(tmp)
            peer = peer_cls.from_pretrained(tmp)
        ours, peer = ours.to(ctx.device), peer.to(ctx.device)
        probe = on_device(make_batch("varlen", 2, max(seq_lens(ctx)), seed=0, vocab_size=config.vocab_size),
                          ctx.device)
        check_same_function(ours, peer, probe, pretraining=training)  # before any step changes the weights
        extra = ()
        if training:
            extra = ({"bertkit": torch.optim.AdamW(ours.parameters(), **ADAMW),
                      "transformers": torch.optim.AdamW(peer.parameters(), **ADAMW)},)
            ours.train(), peer.train()
        else:
            ours.eval(), peer.eval()
        self.pairs[kind] = (config, ours, peer, *extra)
        return self.pairs[kind]

    def peak(self, ctx: Context) -> float:
        if self.peak_gflops is None:
            self.peak_gflops = measure_peak(ctx)
        return self.peak_gflops


MODELS = Models()


# ------------------------------------------------------------------------------------------------------------------
# Rows
# ------------------------------------------------------------------------------------------------------------------
def row_peak(ctx: Context, measured: dict) -> None:
    gflops = measure_peak(ctx)
    MODELS.peak_gflops = max(MODELS.peak_gflops or 0.0, gflops)
    measured.update(bench="peak", dtype="bf16", peak_tflops=round(gflops / 1e3, 2),
                    summary=f"bf16 matmul peak {gflops / 1e3:.1f} TFLOP/s")


def goals(record: dict, kind: str, training: bool, seq_len: int, ctx: Context) -> None:
    """The issue's goals beside the figures, with whether each is met."""
    goal = GOAL_RATIO[kind]
    record["goal_ratio"] = goal
    record["goal_ratio_met"] = record["ratio"] >= goal
    if training and seq_len == (seq_lens(ctx)[0]):
        record["goal_mfu"] = GOAL_MFU
        record["goal_mfu_met"] = record["bertkit_mfu"] >= GOAL_MFU


def pretrain_row(seq_len: int, kind: str, compiled: bool, attention_dropout_0: bool = False):
    """attention_dropout_0: both models without attention dropout (as Cramming and ModernBERT train), where
    bertkit's unpadded path can take PyTorch's own varlen FlashAttention kernel (it has no dropout)."""
    def row(ctx: Context, measured: dict) -> None:
        config, ours, peer, optimizers = MODELS.pair(ctx, "pretrain_attn0" if attention_dropout_0 else "pretrain")
        if compiled:
            _compile_once(ctx, measured, "pretrain", ours, peer)

        def step(model, optimizer, batch, sparse: bool) -> None:
            """zero_grad, forward with both pretraining losses under bf16 autocast, backward, AdamW step."""
            optimizer.zero_grad(set_to_none=True)
            extra = {"predict_at": batch.labels != -100} if sparse else {}
            with ctx.autocast():
                out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                            token_type_ids=batch.token_type_ids, labels=batch.labels,
                            next_sentence_label=batch.nsp_labels, **extra)
            out.loss.backward()
            optimizer.step()

        def attempt(rows: int) -> None:
            batch = on_device(make_batch(kind, rows, seq_len, seed=0, vocab_size=config.vocab_size), ctx.device)
            fns = {"transformers": synced(ctx, lambda: step(peer, optimizers["transformers"], batch, False)),
                   "bertkit": synced(ctx, lambda: step(ours, optimizers["bertkit"], batch, True)),
                   "bertkit_dense_mlm": synced(ctx, lambda: step(ours, optimizers["bertkit"], batch, False))}
            measure(ctx, measured, fns, batch, config, training=True, seq_len=seq_len, kind=kind,
                    compiled=compiled, bench="pretrain_step")
            if attention_dropout_0:
                measured["model"] += ", attention dropout 0"

        with_oom_retry(ctx, measured, rows_for(ctx, True, seq_len), attempt)
    return row


def inference_row(seq_len: int, kind: str, compiled: bool):
    def row(ctx: Context, measured: dict) -> None:
        config, ours, peer = MODELS.pair(ctx, "inference")
        if compiled:
            _compile_once(ctx, measured, "inference", ours, peer)

        @torch.no_grad()
        def forward(model, batch) -> None:
            with ctx.autocast():
                model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                      token_type_ids=batch.token_type_ids)

        def attempt(rows: int) -> None:
            batch = on_device(make_batch(kind, rows, seq_len, seed=0, vocab_size=config.vocab_size), ctx.device)
            if not compiled:
                check_same_function(ours, peer, batch, pretraining=False)
            fns = {"transformers": synced(ctx, lambda: forward(peer, batch)),
                   "bertkit": synced(ctx, lambda: forward(ours, batch))}
            measure(ctx, measured, fns, batch, config, training=False, seq_len=seq_len, kind=kind,
                    compiled=compiled, bench="inference")

        with_oom_retry(ctx, measured, rows_for(ctx, False, seq_len), attempt)
    return row


_COMPILED: set[str] = set()


def _compile_once(ctx: Context, measured: dict, kind: str, ours, peer) -> None:
    """Compile a pair in place the first time a compiled row of it runs (the eager rows ran before)."""
    measured["compile_backend"] = ctx.compile_backend
    if kind not in _COMPILED:
        compile_pair(ours, peer, ctx.compile_backend)
        _COMPILED.add(kind)


def measure(ctx: Context, measured: dict, fns: dict, batch: Batch, config, training: bool, seq_len: int, kind: str,
            compiled: bool, bench: str) -> None:
    """Time `fns` (ABAB..., after warm-up) and fill `measured` with rates, ratios, MFU, memory and goals."""
    iters, warmup = timing_rounds(ctx, compiled)
    if compiled:  # the first call of each side compiles: time it apart, as what compilation costs
        for name in ("transformers", "bertkit"):
            start = time.perf_counter()
            fns[name]()
            measured[f"{name}_first_call_s"] = round(time.perf_counter() - start, 2)
    times = time_alternating(fns, iters=iters, warmup=warmup)
    if compiled:  # compile_layers falls back to eager where compilation fails: say how much was compiled
        from torch._dynamo.utils import counters

        measured["dynamo_unique_graphs"] = int(counters["stats"]["unique_graphs"])
        measured["dynamo_graph_breaks"] = int(sum(counters["graph_break"].values()))
    rows = batch.input_ids.shape[0]
    record = {"bench": bench, "model": model_label(ctx), "seq_len": seq_len, "batch": kind, "batch_size": rows,
              "dtype": "bf16", "compile": compiled}
    record.update(rates(times, batch.real_tokens, "tokens_per_s", "step_s" if training else "call_s"))
    if not training:
        record.update(rates(times, rows, "sequences_per_s", None))
    flops = model_flops(config, batch.lengths, training=training, mlm_head=training)
    peak = MODELS.peak(ctx)
    record = add_mfu(record, flops, peak)
    if "bertkit_dense_mlm" in times:  # where the dense decoder FLOPs of the formula are really spent
        record["bertkit_dense_mlm_mfu"] = round(mfu(flops, median(times["bertkit_dense_mlm"]), peak), 4)
    for name in ("bertkit", "transformers"):
        record[f"{name}_peak_step_mib"], resident = step_memory_mib(ctx, fns[name])
        record["resident_mib"] = resident
    record.update(real_tokens=batch.real_tokens, padded_tokens=rows * seq_len, iters=iters, warmup=warmup)
    goals(record, kind, training, seq_len, ctx)
    measured.update(record)
    mfu_text = f", MFU {record['bertkit_mfu']:.2f} / {record['transformers_mfu']:.2f}"
    measured["summary"] = (f"{record['bertkit_tokens_per_s']:,.0f} vs {record['transformers_tokens_per_s']:,.0f} "
                           f"tok/s, ratio {record['ratio']:.2f} (goal {record['goal_ratio']}: "
                           f"{'met' if record['goal_ratio_met'] else 'NOT met'}){mfu_text}"
                           + (f" (goal {GOAL_MFU}: {'met' if record['goal_mfu_met'] else 'NOT met'})"
                              if "goal_mfu" in record else ""))


def modernbert_row(seq_len: int):
    def row(ctx: Context, measured: dict) -> None:
        """bertkit's ModernBERT against transformers' ModernBertModel on identical weights (ModernBERT-base's
        shape, random weights written by transformers and read by bertkit), inference on the same real tokens
        (variable lengths), bf16 autocast. transformers runs FlashAttention 2 when flash_attn imports, else SDPA
        on its padded batch; bertkit runs its unpadded path (a varlen FlashAttention kernel on a GPU)."""
        try:
            from transformers import ModernBertConfig, ModernBertModel
        except ImportError as err:
            raise Skip(f"this transformers has no ModernBertModel: {err}") from None
        from bertkit.models import ModernBertModel as OurModernBert

        vocab = QUICK_VOCAB if ctx.quick else 30522
        ids = dict(pad_token_id=0, cls_token_id=101, sep_token_id=102, bos_token_id=101, eos_token_id=102)
        if ctx.quick:
            mb_config = ModernBertConfig(vocab_size=QUICK_VOCAB, hidden_size=32, num_hidden_layers=3,
                                         num_attention_heads=4, intermediate_size=48, local_attention=16,
                                         max_position_embeddings=128, **ids)
        else:
            mb_config = ModernBertConfig(**ids)  # ModernBERT-base: 22 layers, H 768, local window 128
        attention, note = "sdpa", "flash_attn does not import: SDPA"
        if ctx.cuda:
            try:
                importlib.import_module("flash_attn")
                attention, note = "flash_attention_2", "FlashAttention 2"
            except Exception as err:  # noqa: BLE001
                note = f"flash_attn does not import ({type(err).__name__}): SDPA"
        else:
            note = "CPU: SDPA"
        if "modernbert" not in MODELS.pairs:  # built once, for both lengths
            probe = on_device(make_batch("varlen", 2, seq_len, seed=1, vocab_size=vocab), ctx.device)
            torch.manual_seed(0)
            try:  # FlashAttention 2 may be refused at construction or fail at the first call (a build mismatch)
                peer = ModernBertModel._from_config(mb_config, attn_implementation=attention).to(ctx.device).eval()
                with torch.no_grad(), ctx.autocast():
                    peer(input_ids=probe.input_ids, attention_mask=probe.attention_mask)
            except Exception as err:  # noqa: BLE001 - the SDPA model is still a comparison
                if attention == "sdpa":
                    raise
                torch.manual_seed(0)
                peer = ModernBertModel._from_config(mb_config, attn_implementation="sdpa").to(ctx.device).eval()
                attention, note = "sdpa", f"flash_attention_2 failed ({type(err).__name__}: {str(err)[:200]}): SDPA"
            with tempfile.TemporaryDirectory() as tmp:
                peer.save_pretrained(tmp)
                ours = OurModernBert.from_pretrained(tmp).to(ctx.device).eval()
            with torch.no_grad():  # the same function, float32, before timing anything
                a = ours(probe.input_ids, probe.attention_mask).last_hidden_state
                b = peer(input_ids=probe.input_ids, attention_mask=probe.attention_mask).last_hidden_state
                real = probe.attention_mask.bool()
                diff = float((a[real] - b[real]).abs().max())
            if not diff <= 1e-3:
                raise AssertionError(f"bertkit's ModernBERT differs from transformers' by {diff:.3g} in float32")
            MODELS.pairs["modernbert"] = (ours, peer, attention, note, diff)
        ours, peer, attention, note, diff = MODELS.pairs["modernbert"]
        measured.update(modernbert_attention=attention, modernbert_note=note, float32_max_diff=diff,
                        parameters=sum(p.numel() for p in ours.parameters()))

        @torch.no_grad()
        def forward(model, batch, ours_: bool) -> None:
            with ctx.autocast():
                if ours_:
                    model(batch.input_ids, batch.attention_mask)
                else:
                    model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)

        def attempt(rows: int) -> None:
            batch = on_device(make_batch("varlen", rows, seq_len, seed=0, vocab_size=vocab), ctx.device)
            fns = {"transformers": synced(ctx, lambda: forward(peer, batch, False)),
                   "bertkit": synced(ctx, lambda: forward(ours, batch, True))}
            iters, warmup = timing_rounds(ctx, False)
            times = time_alternating(fns, iters=iters, warmup=warmup)
            label = "tiny ModernBERT (quick)" if ctx.quick else "ModernBERT-base"
            record = {"bench": "modernbert_inference", "model": label, "seq_len": seq_len,
                      "batch": "varlen", "batch_size": rows, "dtype": "bf16", "compile": False}
            record.update(rates(times, batch.real_tokens, "tokens_per_s", "call_s"))
            record.pop("_median_s")
            record.update(rates(times, rows, "sequences_per_s", None))
            for name in ("bertkit", "transformers"):
                record[f"{name}_peak_step_mib"], _ = step_memory_mib(ctx, fns[name])
            record.update(real_tokens=batch.real_tokens, padded_tokens=rows * seq_len, iters=iters, warmup=warmup)
            measured.update(record)
            measured["summary"] = (f"{label}: bertkit {record['bertkit_tokens_per_s']:,.0f} vs transformers "
                                   f"({attention}) {record['transformers_tokens_per_s']:,.0f} tok/s, ratio "
                                   f"{record['ratio']:.2f}")

        with_oom_retry(ctx, measured, rows_for(ctx, False, seq_len), attempt)
    return row


def _needs_transformers(fn):
    def row(ctx: Context, measured: dict) -> None:
        try:
            importlib.import_module("transformers")
        except ImportError as err:
            raise Skip(f"transformers does not import: {err}") from None
        fn(ctx, measured)
    return row


def plan(ctx: Context) -> list[tuple[str, Callable, float]]:
    """(name, row, seconds it needs at least) in the order they run: eager figures first, compile rows last
    (they cost the most and matter least), so a short budget drops those first."""
    short, long = seq_lens(ctx)
    items: list[tuple[str, Callable, float]] = [("peak", row_peak, 10)]
    for T in (short, long):
        for kind in ("dense", "varlen"):
            items.append((f"pretrain_T{T}_{kind}", _needs_transformers(pretrain_row(T, kind, False)), 30))
    items.append((f"pretrain_T{short}_varlen_attn0", _needs_transformers(pretrain_row(short, "varlen", False, True)),
                  30))
    for T in (short, long):
        for kind in ("dense", "varlen"):
            items.append((f"inference_T{T}_{kind}", _needs_transformers(inference_row(T, kind, False)), 20))
    for T in (short, long):
        items.append((f"modernbert_T{T}_varlen", _needs_transformers(modernbert_row(T)), 30))
    # Reserves of the compile rows: inductor compiles each side's layer for the padded and the unpadded graph
    # (forward and backward when training), about a minute or two per row on a GPU machine.
    for bench, make, reserve in (("pretrain", pretrain_row, 150), ("inference", inference_row, 90)):
        for kind in ("dense", "varlen"):
            row = _needs_transformers(make(short, kind, True))
            if ctx.quick and kind == "dense":  # each compiled row costs seconds of tracing on a CPU
                row = _skip("quick run: the varlen compiled row runs the same suite code")
            items.append((f"{bench}_T{short}_{kind}_compiled", row, reserve))
    return items


def _skip(reason: str):
    def row(ctx: Context, measured: dict) -> None:
        raise Skip(reason)
    return row
