"""Correctness checks of the GPU suite: each fast path against the plain path on the same weights, on the device.

Every check is `check_x(ctx, measured)`: it fills `measured` with what it compared (worst difference, tolerance,
which kernel ran) and raises AssertionError when a difference is out of tolerance, `Skip` when it cannot run here.
The same code runs on CPU (the dry run) and on CUDA; where a branch exists only on CUDA (FlashAttention, NCCL) the
check says so in its record.

Tolerances:
- float32: 1e-5 absolute, the CPU tests' tolerance (tests/models/test_fastpaths.py, test_family.py).
- bf16 autocast: two bf16 computations differ by rounding that depends on the kernels, so a fixed tolerance is
  either loose or flaky. The rule is scaled to bf16 itself: against the float32 plain path as the truth, the fast
  path's error may be at most twice the plain bf16 path's error plus one bf16 unit in the last place at the
  quantity's scale (2^-8 x max(1, max |reference|)); gradients by relative norm, 2 x plain + 2^-8.
- exact resume: bit for bit on CPU; on CUDA, kernels that accumulate with atomics (attention backward, index
  backward) may reorder float sums between two runs, so per-step losses within 1e-5 (float32) and 1e-3 (bf16
  autocast) absolute, with `bitwise` recorded.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch

from bench.gpu.context import ROOT, Context, Skip
from bertkit.models.registry import ARCHITECTURES  # the tables (no torch below them): the rows the suite checks

ATOL = 1e-5
BF16_ULP = 2.0 ** -8  # bf16 keeps 8 significant bits: one unit in the last place at 1.0
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
TINY = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=64)


# ------------------------------------------------------------------------------------------------------------------
# Configs and batches (as in tests/models/test_fastpaths.py and test_family.py)
# ------------------------------------------------------------------------------------------------------------------
def family_config(model_type: str, **overrides):
    """The tests' tiny config of each family (hidden 32, 2 layers, vocabulary 120)."""
    from bertkit import BertConfig

    fields = dict(TINY)
    if model_type == "roberta":
        fields.update(type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5)
    if model_type == "albert":
        fields.update(embedding_size=16, num_hidden_groups=1, hidden_act="gelu_new", bos_token_id=2, eos_token_id=3)
    if model_type == "electra":
        fields.update(embedding_size=16)
    fields.update(overrides)
    return BertConfig.for_family(model_type, **fields)


def fastpath_configs() -> dict:
    """The configs every fast path is pinned on: plain BERT, RoBERTa's offset positions, ALBERT's sharing."""
    from bertkit import BertConfig

    return {
        "bert": BertConfig(**TINY, **NO_DROPOUT),
        "roberta": family_config("roberta", **NO_DROPOUT),
        "albert": family_config("albert", num_hidden_layers=4, **NO_DROPOUT),
    }


def bf16_config(ctx: Context, causal: bool = False):
    """The bf16 checks' model: on the device, BERT-like heads of width 64 (what FlashAttention is built for) and
    length 128; tiny in the quick run."""
    from bertkit import BertConfig

    if ctx.quick:
        return BertConfig(**TINY, **NO_DROPOUT, causal=causal)
    return BertConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                      intermediate_size=1024, max_position_embeddings=128, causal=causal, **NO_DROPOUT)


def padded_batch(config, device: torch.device, lengths=(12, 7, 3, 10), T: int = 12, seed: int = 0):
    """Rows of the given real lengths right-padded to T: (ids, mask, types, labels, nsp), all on `device`.
    MLM labels at every third real position from 1; NSP labels alternate."""
    g = torch.Generator().manual_seed(seed)
    B = len(lengths)
    ids = torch.randint(5, config.vocab_size, (B, T), generator=g)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()  # (B, T)
    ids[mask == 0] = config.pad_token_id
    types = torch.zeros(B, T, dtype=torch.long)
    if config.type_vocab_size > 1:
        types[:, T // 2:] = 1
        types[mask == 0] = 0
    labels = torch.full((B, T), -100)
    for row, n in enumerate(lengths):
        labels[row, 1:n:3] = ids[row, 1:n:3]
    nsp = torch.tensor([i % 2 for i in range(B)])
    return tuple(t.to(device) for t in (ids, mask, types, labels, nsp))


def varied_lengths(ctx: Context, rows: int, T: int, seed: int) -> tuple[int, ...]:
    """Real lengths spread over [2, T] (the longest is T), for batches with padding."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, T + 1, (rows,), generator=g)
    lengths[0] = T
    return tuple(int(n) for n in lengths)


def seeded(cls, config, device: torch.device, seed: int):
    torch.manual_seed(seed)
    return cls(config).to(device)


# ------------------------------------------------------------------------------------------------------------------
# Comparison helpers
# ------------------------------------------------------------------------------------------------------------------
class Tally:
    """Worst absolute difference over many tensor pairs, against one tolerance; `done` raises on any excess."""

    def __init__(self, atol: float) -> None:
        self.atol, self.worst, self.where, self.failures, self.compared = atol, 0.0, None, [], 0

    def add(self, name: str, a: torch.Tensor, b: torch.Tensor) -> None:
        a, b = a.detach().float(), b.detach().float()
        if a.shape != b.shape:
            self.failures.append(f"{name}: shapes {tuple(a.shape)} and {tuple(b.shape)}")
            return
        diff = float((a - b).abs().max()) if a.numel() else 0.0
        self.compared += 1
        if not math.isfinite(diff) or diff > self.worst:
            self.worst, self.where = diff, name
        if not diff <= self.atol:  # also catches NaN
            self.failures.append(f"{name}: max|diff| {diff:.3g}")

    def done(self, measured: dict, key: str = "") -> None:
        prefix = f"{key}_" if key else ""
        measured[f"{prefix}max_abs_diff"] = self.worst
        measured[f"{prefix}worst_tensor"] = self.where
        measured[f"{prefix}tensors_compared"] = self.compared
        measured[f"{prefix}tolerance"] = self.atol
        if self.failures:
            raise AssertionError(f"{len(self.failures)} tensors beyond {self.atol:g}: " + "; ".join(self.failures[:4]))


def grads(model) -> dict[str, torch.Tensor]:
    return {n.replace("._orig_mod", ""): p.grad.detach().clone() for n, p in model.named_parameters()
            if p.grad is not None}


def grads_rel(got: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    """All gradients' distance to the reference's over the reference's norm, as one vector."""
    norm = torch.sqrt(sum((g.float() ** 2).sum() for g in reference.values()))
    return float(torch.sqrt(sum(((got[k].float() - g.float()) ** 2).sum() for k, g in reference.items())) / norm)


def summary(measured: dict, text: str) -> None:
    measured["summary"] = text


def pretraining_pass(model, batch, sparse: bool, ctx: Context | None = None, bf16: bool = False):
    """zero_grad, forward with MLM (+ pair) labels and hidden states, backward; (output, gradients)."""
    ids, mask, types, labels, nsp = batch
    model.zero_grad(set_to_none=True)
    extra = {"predict_at": labels != -100} if sparse else {}
    nsp_label = nsp if model.nsp is not None else None
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=bf16):
        out = model(ids, mask, types, labels=labels, next_sentence_label=nsp_label, output_hidden_states=True,
                    **extra)
    out.loss.backward()
    return out, grads(model)


# ------------------------------------------------------------------------------------------------------------------
# Fast paths, float32
# ------------------------------------------------------------------------------------------------------------------
def check_unpad_fp32(ctx: Context, measured: dict) -> None:
    """Unpadded vs padded attention, float32, forward and backward, dense and sparse MLM, three families and the
    causal LM; padding positions of the unpadded path must stay exactly 0."""
    from bertkit.models import BertForCausalLM, BertForPreTraining, set_fast_paths

    tally = Tally(ATOL)
    for name, config in fastpath_configs().items():
        for sparse in (False, True):
            model = seeded(BertForPreTraining, config, ctx.device, 0).train()
            batch = padded_batch(config, ctx.device)
            real = batch[1].bool()
            plain, plain_grads = pretraining_pass(set_fast_paths(model, unpad=False), batch, sparse)
            fast, fast_grads = pretraining_pass(set_fast_paths(model, unpad=True), batch, sparse)
            tag = f"{name}/{'sparse' if sparse else 'dense'}"
            tally.add(f"{tag}/loss", fast.loss, plain.loss)
            for i, (x, y) in enumerate(zip(fast.hidden_states, plain.hidden_states)):
                tally.add(f"{tag}/hidden_{i}", x[real], y[real])
                assert float(x.detach()[~real].abs().max()) == 0.0, f"{tag}: unpadded path wrote padding positions"
            logits_a, logits_b = ((fast.prediction_logits, plain.prediction_logits) if sparse
                                  else (fast.prediction_logits[real], plain.prediction_logits[real]))
            tally.add(f"{tag}/logits", logits_a, logits_b)
            if plain.seq_relationship_logits is not None:
                tally.add(f"{tag}/pair_logits", fast.seq_relationship_logits, plain.seq_relationship_logits)
            assert fast_grads.keys() == plain_grads.keys()
            for key in plain_grads:
                tally.add(f"{tag}/grad/{key}", fast_grads[key], plain_grads[key])
    config = family_config("bert", causal=True, **NO_DROPOUT)
    model = seeded(BertForCausalLM, config, ctx.device, 4)
    ids, mask, *_ = padded_batch(config, ctx.device)
    labels = ids.masked_fill(mask == 0, -100)
    outs = {}
    for unpad in (True, False):
        model.zero_grad(set_to_none=True)
        out = set_fast_paths(model, unpad=unpad)(ids, mask, labels=labels)
        out.loss.backward()
        outs[unpad] = (out, grads(model))
    tally.add("causal/loss", outs[True][0].loss, outs[False][0].loss)
    tally.add("causal/logits", outs[True][0].logits[mask.bool()], outs[False][0].logits[mask.bool()])
    for key, g in outs[False][1].items():
        tally.add(f"causal/grad/{key}", outs[True][1][key], g)
    tally.done(measured)
    summary(measured, f"max|diff| {tally.worst:.2e} over {tally.compared} tensors (tol {ATOL:g})")


def check_fused_qkv(ctx: Context, measured: dict) -> None:
    """One (3H, H) QKV matmul against three (H, H) ones on the same weights, forward and backward, float32."""
    from bertkit.models import BertForPreTraining, set_fast_paths

    config = fastpath_configs()["bert"]
    model = seeded(BertForPreTraining, config, ctx.device, 1).train()
    batch = padded_batch(config, ctx.device)
    plain, plain_grads = pretraining_pass(set_fast_paths(model, fused_qkv=False), batch, sparse=True)
    fast, fast_grads = pretraining_pass(set_fast_paths(model, fused_qkv=True), batch, sparse=True)
    tally = Tally(ATOL)
    tally.add("loss", fast.loss, plain.loss)
    tally.add("logits", fast.prediction_logits, plain.prediction_logits)
    for key in plain_grads:
        tally.add(f"grad/{key}", fast_grads[key], plain_grads[key])
    tally.done(measured)
    summary(measured, f"max|diff| {tally.worst:.2e} (tol {ATOL:g})")


def check_sparse_mlm(ctx: Context, measured: dict) -> None:
    """The vocabulary projection at the masked positions only (`predict_at`, and the MLM objective's sparse
    prediction) against the dense projection at every position: same loss, logits and gradients, float32."""
    from bertkit.models import BertForPreTraining
    from bertkit.training.objectives import MaskedLMObjective

    config = fastpath_configs()["bert"]
    model = seeded(BertForPreTraining, config, ctx.device, 2).train()
    batch = padded_batch(config, ctx.device)
    at = batch[3] != -100
    dense, dense_grads = pretraining_pass(model, batch, sparse=False)
    sparse, sparse_grads = pretraining_pass(model, batch, sparse=True)
    tally = Tally(ATOL)
    tally.add("loss", sparse.loss, dense.loss)
    tally.add("logits", sparse.prediction_logits, dense.prediction_logits[at])
    for key in dense_grads:
        tally.add(f"grad/{key}", sparse_grads[key], dense_grads[key])
    ids, mask, types, labels, nsp = batch
    as_dict = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types, "labels": labels,
               "next_sentence_label": nsp}
    means = {}
    for flag in (True, False):
        out = MaskedLMObjective(pair_task="nsp", sparse_prediction=flag)(model, as_dict)
        means[flag] = {k: v / c for k, (v, c) in out.items()}
    for key in means[False]:
        tally.add(f"objective/{key}", means[True][key], means[False][key])
    tally.done(measured)
    summary(measured, f"max|diff| {tally.worst:.2e} (tol {ATOL:g}), {int(at.sum())} of {int(batch[1].sum())} "
                      f"real positions projected")


def check_onednn_switch(ctx: Context, measured: dict) -> None:
    """The oneDNN switch: on CPU oneDNN's float32 kernels against F.linear (1e-5); on CUDA it must stand aside
    (no oneDNN call, outputs bit for bit those of the plain path)."""
    import bertkit.models.kernels as kernels
    from bertkit.models import BertForPreTraining, set_fast_paths

    if not ctx.cuda and not kernels._ONEDNN:
        raise Skip("this torch build has no oneDNN linear kernel")
    config = fastpath_configs()["bert"]
    model = seeded(BertForPreTraining, config, ctx.device, 3).train()
    batch = padded_batch(config, ctx.device)
    calls = []
    real_mm, real_min = kernels._onednn_mm, kernels.ONEDNN_MIN_MACS

    def counted(x, weight, bias=None):
        calls.append(tuple(x.shape))
        return real_mm(x, weight, bias)

    kernels._onednn_mm, kernels.ONEDNN_MIN_MACS = counted, 0  # tiny products too: every matmul takes the path
    try:
        plain, plain_grads = pretraining_pass(set_fast_paths(model, onednn=False), batch, sparse=True)
        fast, fast_grads = pretraining_pass(set_fast_paths(model, onednn=True), batch, sparse=True)
    finally:
        kernels._onednn_mm, kernels.ONEDNN_MIN_MACS = real_mm, real_min
    measured["onednn_calls"] = len(calls)
    # On CUDA the two runs are the same kernels: the forward must agree bit for bit; gradients within 1e-5, as
    # attention and index backward accumulate with atomics in an order that may change between two runs.
    forward, backward = Tally(0.0 if ctx.cuda else ATOL), Tally(ATOL)
    forward.add("loss", fast.loss, plain.loss)
    forward.add("logits", fast.prediction_logits, plain.prediction_logits)
    for key in plain_grads:
        backward.add(f"grad/{key}", fast_grads[key], plain_grads[key])
    if ctx.cuda:
        assert not calls, f"oneDNN ran {len(calls)} matmuls on CUDA tensors"
    else:
        assert calls, "the oneDNN switch is on but no matmul went through oneDNN"
    forward.done(measured, "forward")
    backward.done(measured, "grads")
    summary(measured, f"{len(calls)} oneDNN matmuls, max|diff| forward {forward.worst:.2e} (tol {forward.atol:g}), "
                      f"gradients {backward.worst:.2e} (tol {ATOL:g})")


# ------------------------------------------------------------------------------------------------------------------
# bf16 and the attention kernel
# ------------------------------------------------------------------------------------------------------------------
@contextmanager
def attention_kernel_probe(use_flash: bool):
    """Count calls to the variable-length FlashAttention kernels (the flash_attn package's and PyTorch's own), by
    kernel name; with use_flash False, hide both (the SDPA fallback)."""
    import bertkit.models.layouts as layouts

    real = {"flash_attn_varlen": layouts.flash_attn_varlen, "torch_varlen": layouts.torch_varlen}
    calls: list[str] = []

    def counted(name, fn):
        def call(*args, **kwargs):
            calls.append(name)
            return fn(*args, **kwargs)
        return call

    for name, fn in real.items():
        setattr(layouts, name, counted(name, fn) if (fn is not None and use_flash) else None)
    try:
        yield calls
    finally:
        for name, fn in real.items():
            setattr(layouts, name, fn)


def flash_status(ctx: Context) -> str | None:
    """None when a variable-length FlashAttention kernel can run here, else why not."""
    import bertkit.models.layouts as layouts

    if not ctx.cuda:
        return "FlashAttention needs CUDA: the SDPA fallback ran"
    if layouts.flash_attn_varlen is None and layouts.torch_varlen is None:
        try:
            importlib.import_module("flash_attn")
        except Exception as err:  # noqa: BLE001 - any import failure means the fallback
            return (f"flash_attn does not import ({type(err).__name__}: {err}) and this torch has no "
                    "torch.nn.attention.varlen.varlen_attn: the SDPA fallback ran")
        return "flash_attn imports but has no flash_attn_varlen_func: the SDPA fallback ran"
    return None


def kernel_name(calls: list[str]) -> str:
    return calls[0] if calls else "sdpa"


def check_unpad_bf16(ctx: Context, measured: dict) -> None:
    """Unpadded vs padded attention under bf16 autocast, forward and backward, bidirectional and causal, at
    varying lengths; the scaled bf16 rule (module docstring) against the float32 plain path. Reports which
    attention kernel the unpadded path ran; with FlashAttention available, the SDPA fallback is checked too."""
    from bertkit.models import BertForCausalLM, BertForPreTraining, set_fast_paths

    T = 16 if ctx.quick else 128
    rows = 4 if ctx.quick else 16
    not_flash = flash_status(ctx)
    measured["flash_attn_available"] = not_flash is None
    if not_flash:
        measured["flash_attn_note"] = not_flash
    kernels_run, failures, worst = {}, [], {}
    for causal in (False, True):
        config = bf16_config(ctx, causal)
        cls = BertForCausalLM if causal else BertForPreTraining
        model = seeded(cls, config, ctx.device, 5).train()
        ids, mask, types, labels, nsp = padded_batch(config, ctx.device, varied_lengths(ctx, rows, T, 6), T, seed=6)
        real = mask.bool()
        if causal:
            labels = ids.masked_fill(mask == 0, -100)

        def run(unpad: bool, bf16: bool, use_flash: bool = True):
            set_fast_paths(model, unpad=unpad)
            model.zero_grad(set_to_none=True)
            with attention_kernel_probe(use_flash) as calls, ctx.autocast(bf16):
                if causal:  # the causal LM returns no hidden states: its logits at every real position
                    out = model(ids, mask, types, labels=labels)
                    result = {"logits": out.logits[real]}
                else:
                    out = model(ids, mask, types, labels=labels, next_sentence_label=nsp, output_hidden_states=True,
                                predict_at=labels != -100)
                    result = {"hidden": out.hidden_states[-1][real], "logits": out.prediction_logits}
            out.loss.backward()
            result["loss"] = out.loss
            return {k: v.detach().float() for k, v in result.items()}, grads(model), list(calls)

        reference, reference_grads, _ = run(unpad=False, bf16=False)
        plain, plain_grads, _ = run(unpad=False, bf16=True)
        variants = {"unpadded": True}
        if not_flash is None:
            variants["unpadded_sdpa_fallback"] = False
        for variant, use_flash in variants.items():
            fast, fast_grads, flash_calls = run(unpad=True, bf16=True, use_flash=use_flash)
            tag = f"{'causal' if causal else 'bidirectional'}/{variant}"
            kernels_run[tag] = kernel_name(flash_calls)
            for key, ref in reference.items():
                scale = max(1.0, float(ref.abs().max()))
                err_plain = float((plain[key] - ref).abs().max())
                err_fast = float((fast[key] - ref).abs().max())
                bound = 2 * err_plain + BF16_ULP * scale
                worst[f"{tag}/{key}"] = {"fast_err": err_fast, "plain_bf16_err": err_plain, "bound": bound}
                if not err_fast <= bound:
                    failures.append(f"{tag}/{key}: error {err_fast:.3g} > bound {bound:.3g}")
            err_plain, err_fast = grads_rel(plain_grads, reference_grads), grads_rel(fast_grads, reference_grads)
            bound = 2 * err_plain + BF16_ULP
            worst[f"{tag}/grads_rel"] = {"fast_err": err_fast, "plain_bf16_err": err_plain, "bound": bound}
            if not err_fast <= bound:
                failures.append(f"{tag}/grads: relative error {err_fast:.3g} > bound {bound:.3g}")
    measured["attention_kernel"] = kernels_run
    measured["errors"] = worst
    measured["tolerance"] = "bf16 rule: fast error <= 2 x plain bf16 error + 2^-8 x scale (vs float32 plain path)"
    if ctx.cuda and not_flash is None and set(kernels_run.values()) == {"sdpa"}:
        failures.append("a varlen FlashAttention kernel is there but the unpadded bf16 path never called it")
    if failures:
        raise AssertionError("; ".join(failures[:4]))
    ran = kernels_run.get("bidirectional/unpadded", "?")
    summary(measured, f"attention kernel {ran}; worst fast/plain-bf16 error ratio "
                      f"{max(v['fast_err'] / max(v['bound'], 1e-30) for v in worst.values()):.2f} of the bound"
                      + (f"; {not_flash}" if not_flash else ""))


def check_modernbert_bf16(ctx: Context, measured: dict) -> None:
    """ModernBERT's unpadded path (global layers and sliding-window layers) against its padded path under bf16
    autocast, forward and backward, at varying lengths longer than the window; the bf16 rule against the float32
    padded path. Reports the attention kernel of the unpadded path (a varlen FlashAttention kernel on a GPU)."""
    from bertkit.config import ModernBertConfig
    from bertkit.models.modernbert import ModernBertModel

    T = 24 if ctx.quick else 128
    rows = 4 if ctx.quick else 16
    size = (dict(hidden_size=32, intermediate_size=24, num_hidden_layers=3, num_attention_heads=2, local_attention=8)
            if ctx.quick else dict(hidden_size=256, intermediate_size=384, num_hidden_layers=3, num_attention_heads=4,
                                   local_attention=32))
    config = ModernBertConfig(vocab_size=1000, max_position_embeddings=T, pad_token_id=0, bos_token_id=1,
                              eos_token_id=2, cls_token_id=1, sep_token_id=2, global_attn_every_n_layers=2, **size)
    model = seeded(ModernBertModel, config, ctx.device, 11).train()
    lengths = varied_lengths(ctx, rows, T, 12)
    g = torch.Generator().manual_seed(13)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids = (torch.randint(3, config.vocab_size, (rows, T), generator=g) * mask).to(ctx.device)
    mask = mask.to(ctx.device)
    real = mask.bool()
    weight = torch.randn(rows, T, config.hidden_size, generator=g).to(ctx.device)

    def run(unpad: bool, bf16: bool):
        model.unpad = unpad
        model.zero_grad(set_to_none=True)
        with attention_kernel_probe(True) as calls, ctx.autocast(bf16):
            hidden = model(ids, mask).last_hidden_state
        (hidden.float() * weight)[real].sum().backward()
        return hidden[real].detach().float(), grads(model), list(calls)

    try:
        reference, reference_grads, _ = run(unpad=False, bf16=False)
        plain, plain_grads, _ = run(unpad=False, bf16=True)
        fast, fast_grads, calls = run(unpad=True, bf16=True)
    finally:
        model.unpad = True
    failures = []
    scale = max(1.0, float(reference.abs().max()))
    err_plain, err_fast = float((plain - reference).abs().max()), float((fast - reference).abs().max())
    bound = 2 * err_plain + BF16_ULP * scale
    measured["hidden"] = {"fast_err": err_fast, "plain_bf16_err": err_plain, "bound": bound}
    if not err_fast <= bound:
        failures.append(f"hidden: error {err_fast:.3g} > bound {bound:.3g}")
    g_plain, g_fast = grads_rel(plain_grads, reference_grads), grads_rel(fast_grads, reference_grads)
    g_bound = 2 * g_plain + BF16_ULP
    measured["grads_rel"] = {"fast_err": g_fast, "plain_bf16_err": g_plain, "bound": g_bound}
    if not g_fast <= g_bound:
        failures.append(f"grads: relative error {g_fast:.3g} > bound {g_bound:.3g}")
    measured["attention_kernels"] = sorted(set(calls)) or ["sdpa"]
    not_flash = flash_status(ctx)
    if ctx.cuda and not_flash is None and not calls:
        failures.append("a varlen FlashAttention kernel is there but ModernBERT's unpadded path never called it")
    if failures:
        raise AssertionError("; ".join(failures))
    summary(measured, f"attention kernel {kernel_name(calls)} ({len(calls)} calls: global and windowed layers); "
                      f"hidden error {err_fast:.3g} (bound {bound:.3g}), gradients {g_fast:.3g} (bound {g_bound:.3g})"
                      + (f"; {not_flash}" if not_flash else ""))


def check_bf16_loss_curve(ctx: Context, measured: dict) -> None:
    """200 steps of a tiny MLM through the trainer under bf16 autocast follow the float32 run's loss curve (means
    of 10 windows of 20 steps within 2% of the first window's loss; measured on CPU: 0.2%), and both learn."""
    from bertkit import BertConfig, BertForMaskedLM
    from bertkit.training.objectives import MaskedLMObjective
    from bertkit.training.trainer import TrainConfig, train

    steps = 200
    config = BertConfig(**TINY, **NO_DROPOUT)
    batches = counting_batches(config, ctx.device, count=8)
    curves = {}
    with tempfile.TemporaryDirectory() as tmp:
        for precision in ("fp32", "bf16"):
            torch.manual_seed(9)
            model = BertForMaskedLM(config)
            train_config = TrainConfig(max_steps=steps, warmup_steps=10, learning_rate=2e-3, progress=False,
                                       device=str(ctx.device), precision=precision, log_every=1, save_every=10_000,
                                       max_grad_norm=1.0)
            train(model, MaskedLMObjective(pair_task=None), Cycle(batches), train_config, Path(tmp) / precision)
            curves[precision] = torch.tensor(read_metric(Path(tmp) / precision, "mlm_loss"))
    fp32, bf16 = curves["fp32"], curves["bf16"]
    assert len(fp32) == len(bf16) == steps, (len(fp32), len(bf16))
    smooth = lambda c: c.unfold(0, 20, 20).mean(1)  # noqa: E731 - the means of 10 windows of 20 steps
    a, b = smooth(fp32), smooth(bf16)
    gap = float((a - b).abs().max())
    measured.update(fp32_windows=[round(float(x), 4) for x in a], bf16_windows=[round(float(x), 4) for x in b],
                    max_window_gap=gap, tolerance=0.02 * float(a[0]))
    assert float(a[-1]) < 0.7 * float(a[0]), f"float32 run did not learn: {float(a[0]):.3f} -> {float(a[-1]):.3f}"
    assert float(b[-1]) < 0.7 * float(b[0]), f"bf16 run did not learn: {float(b[0]):.3f} -> {float(b[-1]):.3f}"
    assert gap < 0.02 * float(a[0]), f"bf16 curve {gap:.4f} away from float32 (tol {0.02 * float(a[0]):.4f})"
    summary(measured, f"loss {float(a[0]):.3f} -> {float(a[-1]):.3f} (fp32) / {float(b[-1]):.3f} (bf16), "
                      f"window gap {gap:.4f} (tol {0.02 * float(a[0]):.4f})")


def counting_batches(config, device: torch.device, count: int, seed: int = 8) -> list[dict]:
    """Padded, variable-length MLM batches of counting sequences (each token predicts its neighbours), as in the
    bf16 test of tests/models/test_fastpaths.py: a task a tiny model learns in 200 steps."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        lengths = tuple(int(n) for n in torch.randint(6, 17, (8,), generator=g))
        ids, mask, types, _, _ = padded_batch(config, torch.device("cpu"), lengths, T=16,
                                              seed=int(torch.randint(0, 10**6, (1,), generator=g)))
        start = torch.randint(5, 60, (8, 1), generator=g)
        ids = torch.where(mask.bool(), 5 + (start + torch.arange(16)) % (config.vocab_size - 5), ids)
        picked = (torch.rand(8, 16, generator=g) < 0.15) & mask.bool()
        picked[:, 2] = True
        out.append({"input_ids": ids.masked_fill(picked, 4), "attention_mask": mask, "token_type_ids": types,
                    "labels": torch.where(picked, ids, torch.full_like(ids, -100)),
                    "next_sentence_label": torch.tensor([i % 2 for i in range(8)])})
    return out  # on the CPU: the trainer moves each batch to the device, as with real data


class Cycle:
    """The trainer's batch source over a fixed list: batch i carries `_state` i + 1 (the position after it), and
    `load_state_dict` seeks, so a resumed run continues where the checkpoint was taken. `stop_after`: raise
    `Interrupted` when batch number `stop_after` is asked for, as a crash at that point would."""

    def __init__(self, batches: list[dict], stop_after: int | None = None) -> None:
        self.batches, self.stop_after, self.start = batches, stop_after, 0

    def __iter__(self):
        i = self.start
        while True:
            if self.stop_after is not None and i >= self.stop_after:
                raise Interrupted(f"interrupted before batch {i}")
            yield {**self.batches[i % len(self.batches)], "_state": i + 1}
            i += 1

    def load_state_dict(self, state) -> None:
        self.start = int(state)


class Interrupted(RuntimeError):
    pass


def read_metric(run_dir: Path, key: str) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)[key] for line in lines if f'"{key}"' in line]


def step_losses(run_dir: Path) -> dict[int, float]:
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


# ------------------------------------------------------------------------------------------------------------------
# Optimizer, checkpoints, resume
# ------------------------------------------------------------------------------------------------------------------
def check_fused_adamw(ctx: Context, measured: dict) -> None:
    """The trainer's fused AdamW (one kernel over every parameter) against the plain per-parameter loop: 5 steps
    on identical models, batches and parameter groups (weight decay off biases and LayerNorm) give the same
    losses and parameters within 1e-5."""
    from bertkit.models import BertForPreTraining
    from bertkit.training.trainer import param_groups

    config = fastpath_configs()["bert"]
    models = {name: seeded(BertForPreTraining, config, ctx.device, 10).train() for name in ("fused", "plain")}
    settings = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-6)
    try:
        fused = torch.optim.AdamW(param_groups(models["fused"], 0.01), fused=True, **settings)
    except (RuntimeError, TypeError, ValueError) as err:
        if ctx.cuda:
            raise
        raise Skip(f"this torch build has no fused AdamW on {ctx.device.type}: {err}") from None
    optimizers = {"fused": fused,
                  "plain": torch.optim.AdamW(param_groups(models["plain"], 0.01), foreach=False, fused=False,
                                             **settings)}
    tally = Tally(ATOL)
    for step in range(5):
        batch = padded_batch(config, ctx.device, seed=step)
        losses = {}
        for name, model in models.items():
            losses[name] = pretraining_pass(model, batch, sparse=True)[0].loss
            optimizers[name].step()
        tally.add(f"step{step}/loss", losses["fused"], losses["plain"])
    plain_params = dict(models["plain"].named_parameters())
    for key, p in models["fused"].named_parameters():
        tally.add(f"param/{key}", p, plain_params[key])
    tally.done(measured)
    summary(measured, f"5 steps, max|diff| {tally.worst:.2e} (tol {ATOL:g})")


def check_model_directory(ctx: Context, measured: dict) -> None:
    """save_pretrained from the device and from_pretrained back onto it: every tensor and the outputs identical."""
    from bertkit.models import BertForPreTraining

    config = fastpath_configs()["bert"]
    model = seeded(BertForPreTraining, config, ctx.device, 11).eval()
    ids, mask, types, *_ = padded_batch(config, ctx.device)
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        model.save_pretrained(tmp)
        again = BertForPreTraining.from_pretrained(tmp).to(ctx.device).eval()
        for (k, a), (k2, b) in zip(model.state_dict().items(), again.state_dict().items()):
            assert k == k2 and torch.equal(a, b), f"{k}: not the saved tensor"
        a, b = model(ids, mask, types), again(ids, mask, types)
    # The same weights through the same kernels: bit for bit expected (a difference within 1e-6 is recorded as
    # not bitwise, and passes: cuBLAS may pick another algorithm for a tensor at another address).
    tally = Tally(1e-6)
    tally.add("prediction_logits", a.prediction_logits, b.prediction_logits)
    tally.add("seq_relationship_logits", a.seq_relationship_logits, b.seq_relationship_logits)
    measured["tensors"] = len(model.state_dict())
    measured["outputs_bitwise"] = bool(torch.equal(a.prediction_logits, b.prediction_logits)
                                       and torch.equal(a.seq_relationship_logits, b.seq_relationship_logits))
    tally.done(measured)
    summary(measured, f"{len(model.state_dict())} tensors bit for bit; outputs bitwise {measured['outputs_bitwise']}")


def check_exact_resume(ctx: Context, measured: dict) -> None:
    """bertkit.training.trainer.train with a run directory, dropout on: a run interrupted after 8 steps (checkpoints every
    3) and resumed with `resume=True` logs the per-step losses of an uninterrupted 12-step run; float32 and bf16
    autocast. Tolerance: bit for bit on CPU; on CUDA 1e-5 (float32) and 1e-3 (bf16) absolute (module docstring)."""
    from bertkit import BertConfig, BertForPreTraining
    from bertkit.training.objectives import MaskedLMObjective
    from bertkit.training.trainer import TrainConfig, train

    config = BertConfig(**TINY, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    batches = counting_batches(config, ctx.device, count=5, seed=12)
    objective = MaskedLMObjective(pair_task="nsp")
    failures = []
    for precision, cuda_tol in (("fp32", 1e-5), ("bf16", 1e-3)):
        tol = cuda_tol if ctx.cuda else 0.0
        train_config = TrainConfig(max_steps=12, warmup_steps=2, learning_rate=1e-3, progress=False,
                                   device=str(ctx.device), precision=precision, log_every=1, save_every=3,
                                   keep_last=2)
        with tempfile.TemporaryDirectory() as tmp:
            runs = {}
            for name in ("full", "interrupted"):
                torch.manual_seed(13)
                model = BertForPreTraining(config)
                source = Cycle(batches, stop_after=8 if name == "interrupted" else None)
                try:
                    train(model, objective, source, train_config, Path(tmp) / name)
                except Interrupted:
                    pass
                runs[name] = Path(tmp) / name
            cut = step_losses(runs["interrupted"])
            assert max(cut) == 8, f"the interrupted run logged steps up to {max(cut)}, expected 8"
            torch.manual_seed(99)  # a different initialisation: everything must come from the checkpoint
            train(BertForPreTraining(config), objective, Cycle(batches), train_config, runs["interrupted"],
                  resume=True)
            full, resumed = step_losses(runs["full"]), step_losses(runs["interrupted"])
        assert sorted(full) == sorted(resumed) == list(range(1, 13)), (sorted(full), sorted(resumed))
        worst = max(abs(full[s] - resumed[s]) for s in full)
        measured[f"{precision}_max_abs_diff"] = worst
        measured[f"{precision}_bitwise"] = all(full[s] == resumed[s] for s in full)
        measured[f"{precision}_tolerance"] = tol
        if not worst <= tol:
            failures.append(f"{precision}: per-step losses differ by up to {worst:.3g} (tol {tol:g})")
    if failures:
        raise AssertionError("; ".join(failures))
    summary(measured, f"resumed at step 6 of 12; fp32 bitwise {measured['fp32_bitwise']}, bf16 bitwise "
                      f"{measured['bf16_bitwise']} (max|diff| {measured['fp32_max_abs_diff']:.1e} / "
                      f"{measured['bf16_max_abs_diff']:.1e})")


class SyncChecked:
    """A batch source that turns `torch.cuda.set_sync_debug_mode("error")` on while the trainer runs steps 1 ..
    `checked` (from fetching a step's batches to fetching the next step's), and off before the last step (whose
    log line and checkpoint read the device by design): any wait for the device in those steps raises."""

    def __init__(self, batches: list[dict], checked: int) -> None:
        self.batches, self.checked, self.fetched = batches, checked, 0

    def __iter__(self):
        for i, batch in enumerate(self.batches):
            torch.cuda.set_sync_debug_mode("error" if i < self.checked else "default")
            self.fetched = i + 1
            yield {**batch, "_state": i + 1}
        torch.cuda.set_sync_debug_mode("default")


def check_no_sync_steps(ctx: Context, measured: dict) -> None:
    """The step loop waits for the device only at log, eval and save steps: 4 steps of MLM + NSP (sparse
    prediction, padded rows of other lengths: the unpadded layout) and of ELECTRA through
    `bertkit.training.trainer.train` with one log line and one checkpoint at the end, the first 3 under
    `torch.cuda.set_sync_debug_mode("error")` (a device read, a blocking copy or a boolean-mask index raises).
    CUDA only: on the CPU the same property is counted by tests/training/test_trainer.py (DeviceReads)."""
    if not ctx.cuda:
        raise Skip("torch.cuda.set_sync_debug_mode needs CUDA; on the CPU tests/training/test_trainer.py counts the loop's "
                   "device reads")
    from bertkit import BertConfig, BertForPreTraining
    from bertkit.models import GeneratorDiscriminator
    from bertkit.training.objectives import ElectraObjective, MaskedLMObjective
    from bertkit.training.trainer import TrainConfig, train

    steps = 4
    runs = {
        "mlm_nsp": lambda: (BertForPreTraining(BertConfig(**TINY, **NO_DROPOUT)), MaskedLMObjective(pair_task="nsp")),
        "electra": lambda: (GeneratorDiscriminator(family_config("electra", **NO_DROPOUT), generator_fraction=0.5),
                            ElectraObjective()),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, build in runs.items():
            torch.manual_seed(14)
            model, objective = build()
            batches = counting_batches(model.config, ctx.device, count=steps, seed=15)
            source = SyncChecked(batches, checked=steps - 1)
            config = TrainConfig(max_steps=steps, warmup_steps=0, learning_rate=1e-3, progress=False,
                                 device=str(ctx.device), precision="fp32", log_every=1000, save_every=1000,
                                 max_grad_norm=1.0)
            try:
                train(model, objective, source, config, Path(tmp) / name)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            measured[f"{name}_steps_checked"] = steps - 1
            assert source.fetched == steps and len(step_losses(Path(tmp) / name)) == 1
    summary(measured, f"MLM+NSP and ELECTRA: {steps - 1} steps each under sync debug mode 'error', no device wait")


def check_no_sync_task_steps(ctx: Context, measured: dict) -> None:
    """Fine-tuning and distillation steps wait for the device only at log, eval and save steps: 4 steps each
    through `bertkit.training.trainer.train`, the first 3 under `torch.cuda.set_sync_debug_mode("error")`, on the batches
    a task run makes (`bertkit.tasks.run.EpochBatches`: dynamic padding, length bucketing, collated by a worker
    process into pinned memory), dropout 0.1 (the recipe's):
      finetune_classify    BertForSequenceClassification + the classification family's loss
                           (`bertkit.tasks.classify.SequenceClassificationTask`)
      distill_classify     a 1-layer student of a 2-layer teacher (`bertkit.training.distill.DistillationTask`: soft, hard,
                           logits and hidden-state losses through a projection), transfer rows without labels
    Every run is tried; the check fails naming each run that waited (the operation's error line). CUDA only: on
    the CPU tests/training/test_trainer.py counts the same runs' device reads."""
    if not ctx.cuda:
        raise Skip("torch.cuda.set_sync_debug_mode needs CUDA; on the CPU tests/training/test_trainer.py counts the task "
                   "runs' device reads")
    import numpy as np

    from bertkit import BertConfig
    from bertkit.training.distill import DistillationStudent, DistillationTask, DistillConfig, layer_map
    from bertkit.models import IGNORE_INDEX, BertForSequenceClassification
    from bertkit.tasks.run import EpochBatches
    from bertkit.tasks.classify import SequenceClassificationTask
    from bertkit.training.trainer import TrainConfig, train

    steps, rng = 4, np.random.default_rng(16)
    features = []
    for i in range(64):
        ids = [2] + [int(x) for x in rng.integers(5, 120, rng.integers(2, 15))] + [3]
        label = IGNORE_INDEX if i % 5 == 4 else i % 2  # every fifth: a transfer-set row (distillation only)
        features.append({"input_ids": ids, "token_type_ids": [0] * len(ids), "label": label})
    labelled = [f for f in features if f["label"] != IGNORE_INDEX]

    def batches(rows):
        stream = EpochBatches(rows, 0, 8, seed=0, bucket_window=2, workers=1, pin_memory=True)
        it = iter(stream)
        try:
            return [next(it) for _ in range(steps)]
        finally:
            it.close()

    def finetune_run():
        model = BertForSequenceClassification(BertConfig(**TINY), num_labels=2)
        return model, SequenceClassificationTask(), batches(labelled)

    def distill_run():
        teacher = BertForSequenceClassification(BertConfig(**TINY), num_labels=2).to(ctx.device)
        student = BertForSequenceClassification(BertConfig(**{**TINY, "num_hidden_layers": 1, "hidden_size": 16,
                                                               "num_attention_heads": 2}), num_labels=2)
        pairs = layer_map("uniform", 1, 2)
        task = DistillationTask(teacher, DistillConfig(alpha_logits=0.5, alpha_hidden=1.0), "classification", pairs)
        return DistillationStudent(student, pairs, teacher.config.hidden_size), task, batches(features)

    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, build in (("finetune_classify", finetune_run), ("distill_classify", distill_run)):
            torch.manual_seed(17)
            model, task, made = build()
            source = SyncChecked([{k: v for k, v in b.items() if k != "_state"} for b in made], checked=steps - 1)
            config = TrainConfig(max_steps=steps, warmup_steps=0, learning_rate=1e-3, progress=False,
                                 device=str(ctx.device), precision="fp32", log_every=1000, save_every=1000,
                                 max_grad_norm=1.0)
            try:
                train(model, task, source, config, Path(tmp) / name)
                measured[f"{name}_steps_checked"] = steps - 1
            except RuntimeError as err:  # the sync debug mode's error, naming the operation that waited
                measured[f"{name}_error"] = str(err).splitlines()[0][:300]
                failed.append(name)
            finally:
                torch.cuda.set_sync_debug_mode("default")
    assert not failed, f"waited for the device between log steps: {', '.join(failed)} (see *_error)"
    summary(measured, f"fine-tuning and distillation: {steps - 1} steps each under sync debug mode 'error', no "
                      f"device wait")


# ------------------------------------------------------------------------------------------------------------------
# Every row of the objective table and every fine-tuning family, under the sync debug mode
# ------------------------------------------------------------------------------------------------------------------
# Tiny sizes per model file (config class), as `bertkit pretrain` options
ROW_SIZES = {
    "BertConfig": ["--hidden-size", "32", "--num-hidden-layers", "2", "--num-attention-heads", "2",
                   "--intermediate-size", "64"],
    "ModernBertConfig": ["--hidden-size", "32", "--num-hidden-layers", "2", "--num-attention-heads", "2",
                         "--intermediate-size", "48", "--local-attention", "8"],
    "T5Config": ["--d-model", "32", "--d-kv", "8", "--d-ff", "64", "--num-layers", "2", "--num-heads", "4"],
    "XLNetConfig": ["--d-model", "32", "--n-layer", "2", "--n-head", "4", "--d-inner", "48", "--reuse-len", "8",
                    "--mem-len", "16"],
    "ElmoConfig": ["--lstm-dim", "48", "--projection-dim", "16", "--sampled-softmax", "8"],
}


def objective_rows() -> list[tuple[str, str, str]]:
    """(name, objective, architecture): one per row of the objective table (bertkit.models.registry.OBJECTIVES)
    and model file among the architectures that take it (the BERT family shares one), so a new row is checked
    without editing the suite."""
    from bertkit.models.registry import OBJECTIVES

    rows = []
    for name, row in OBJECTIVES.items():
        seen = set()
        for arch in row.architectures:
            if ARCHITECTURES[arch].config_class in seen:
                continue
            seen.add(ARCHITECTURES[arch].config_class)
            rows.append((name if arch == row.architectures[0] else f"{arch}_{name}", name, arch))
    return rows


def _tokenizer_args(objective: str, arch: str) -> list[str]:
    """The tokenizer a row's shards need, from the tables: the architecture's kind (a BPE family reads WordPiece
    shards as well), T5's sentinels, XLNet's <cls>/<sep>."""
    from bertkit.models.registry import OBJECTIVES

    kind, needs = ARCHITECTURES[arch].tokenizer, OBJECTIVES[objective].special_tokens
    if kind == "word":
        return ["--kind", "word", "--vocab-size", "40"]
    if kind == "unigram" and "sentinels" in needs:
        return ["--kind", "unigram", "--vocab-size", "220", "--extra-ids", "100"]
    if kind == "unigram" and OBJECTIVES[objective].implies == arch:
        return ["--kind", "unigram", "--xlnet", "--vocab-size", "120"]
    return ["--kind", "wordpiece", "--vocab-size", "120", "--min-frequency", "1"]


def row_data(ctx: Context, objective: str, arch: str) -> Path:
    """Shards of a small synthetic corpus for the row's tokenizer (made once per tokenizer under ctx.out)."""
    import random

    from bertkit.cli import main

    args = _tokenizer_args(objective, arch)
    root = ctx.out / "rows" / "-".join(a.lstrip("-") for a in args)
    if (root / "data" / "manifest.json").is_file():
        return root / "data"
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    words = "the a cat dog sat ran on under mat park big small red blue house river city old new".split()
    text = "\n\n".join("\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(4, 9))) + " ."
                                  for _ in range(rng.randint(2, 5))) for _ in range(60))
    (root / "corpus.txt").write_text(text + "\n", encoding="utf-8")
    assert main(["tokenizer", "train", "--files", str(root / "corpus.txt"), *args, "--out", str(root / "tok"),
                 "--quiet"]) == 0
    assert main(["prepare", "--corpus", str(root / "corpus.txt"), "--tokenizer", str(root / "tok"), "--out",
                 str(root / "data"), "--quiet"]) == 0
    return root / "data"


@contextmanager
def sync_checked_moves(checked: int):
    """`torch.cuda.set_sync_debug_mode("error")` from the trainer's move of micro-batch 1 to its move of micro-batch
    `checked` + 1 (then "default": the last step's log line and checkpoint read the device by design): any wait for
    the device in those steps raises. Yields the number of moves seen."""
    from bertkit.training import trainer

    move, seen = trainer._move, [0]

    def moved(batch, device):
        seen[0] += 1
        torch.cuda.set_sync_debug_mode("error" if seen[0] <= checked else "default")
        return move(batch, device)

    trainer._move = moved
    try:
        yield seen
    finally:
        trainer._move = move
        torch.cuda.set_sync_debug_mode("default")


def check_no_sync_row(objective: str, arch: str):
    """4 steps of `bertkit pretrain` for one row of the objective table (a tiny model, its own stream, one log
    line and one checkpoint at the end), the first 3 under the sync debug mode "error": no device read between
    log steps. CUDA only; on the CPU tests/training/test_objectives.py counts the same runs' device reads."""
    def check(ctx: Context, measured: dict) -> None:
        if not ctx.cuda:
            raise Skip("torch.cuda.set_sync_debug_mode needs CUDA; on the CPU tests/training/test_objectives.py counts this "
                       "row's device reads (test_no_device_reads_between_logs)")
        from bertkit.cli import main
        from bertkit.models.registry import OBJECTIVES

        row, architecture = OBJECTIVES[objective], ARCHITECTURES[arch]
        config_class = architecture.config_class.__name__
        recipe = f"{row.implies}-mini" if row.implies else \
            ("mini" if architecture.config_class is ARCHITECTURES["bert"].config_class else f"{arch}-mini")
        fields = dict(architecture.config_fields)
        if row.requires is not None:
            fields[row.requires[0]] = row.requires[1]
        args = ["pretrain", "--data", str(row_data(ctx, objective, arch)), "--config", recipe, "--objective",
                objective, "--preset", "tiny", *ROW_SIZES[config_class], "--max-seq-length",
                "9" if config_class == "ElmoConfig" else "32", "--max-predictions-per-seq", "5", "--batch-size",
                "8", "--max-steps", "4", "--log-every", "1000", "--save-every", "1000", "--eval-instances", "0",
                "--progress", "false", "--device", "cuda", "--precision", "fp32"]
        for key, value in fields.items():
            args += [f"--{key.replace('_', '-')}", str(value).lower() if isinstance(value, bool) else str(value)]
        with tempfile.TemporaryDirectory() as tmp, sync_checked_moves(3) as seen:
            try:
                code = main([*args, "--out", str(Path(tmp) / "run")])
            except RuntimeError as err:  # the sync debug mode's error, naming the operation that waited
                measured["error_line"] = str(err).splitlines()[0][:300]
                raise
            assert code == 0, f"bertkit pretrain exited {code}"
        measured.update(objective=objective, architecture=arch, steps_checked=3, moves=seen[0])
        summary(measured, f"{objective} on {arch}: 3 steps under sync debug mode 'error', no device wait")
    return check


def check_no_sync_finetune(family: str):
    """4 steps of `bertkit finetune classify` on a tiny random model of the family (`bertkit init`; ELMo with
    --frozen, T5 as text to text), the first 3 under the sync debug mode "error". CUDA only; on the CPU
    tests/models/test_family_matrix.py counts every family x kind's device reads."""
    def check(ctx: Context, measured: dict) -> None:
        if not ctx.cuda:
            raise Skip("torch.cuda.set_sync_debug_mode needs CUDA; on the CPU tests/models/test_family_matrix.py "
                       "counts every fine-tuning cell's device reads")
        import random

        from bertkit.cli import main

        row = ARCHITECTURES[family]
        objective = row.objectives[0] if row.objectives else "roberta"
        data = row_data(ctx, objective, family)
        rng = random.Random(1)
        words = "the a cat dog sat ran on under mat park big small red blue house river city old new".split()
        with tempfile.TemporaryDirectory() as tmp, sync_checked_moves(3) as seen:
            tmp = Path(tmp)
            rows = ["text,label"] + [f"{' '.join(rng.choice(words) for _ in range(rng.randint(3, 9)))},"
                                     f"{'pos' if i % 2 else 'neg'}" for i in range(32)]
            (tmp / "train.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
            preset = "tiny" if "tiny" in row.presets else next(iter(row.presets))
            assert main(["init", "--model-type", family, "--tokenizer", str(data.parent / "tok"), "--preset",
                         preset, "--out", str(tmp / "model")]) == 0
            frozen = ["--frozen"] if "sequence" not in row.roles and not row.text_to_text else []
            code = main(["finetune", "classify", "--model", str(tmp / "model"), "--train", str(tmp / "train.csv"),
                         "--dev", str(tmp / "train.csv"), "--out", str(tmp / "run"), "--epochs", "1",
                         "--batch-size", "8", "--max-seq-length", "32", "--log-every", "1000", "--device", "cuda",
                         "--quiet", *frozen])
            assert code == 0, f"bertkit finetune exited {code}"
        measured.update(family=family, steps_checked=3, moves=seen[0])
        summary(measured, f"{family} classify: 3 steps under sync debug mode 'error', no device wait")
    return check


# ------------------------------------------------------------------------------------------------------------------
# The families against transformers
# ------------------------------------------------------------------------------------------------------------------
def _transformers():
    try:
        import transformers
    except ImportError as err:
        raise Skip(f"transformers does not import: {err}") from None
    return transformers


def randomize(model, seed: int):
    """Every parameter random (LayerNorms and biases too), so parity cannot hide behind ones and zeros."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if p.dim() == 1 and p.shape[0] <= 64 else 0.0))
    return model.eval()


def family_pair(kind: str):
    """(bertkit model, transformers model, config, what to compare) for one family, identical weights: the
    transformers model randomised, saved, and loaded by bertkit's from_pretrained."""
    from bertkit.models import BertForCausalLM, BertForPreTraining, BertForReplacedTokenDetection

    transformers = _transformers()
    table = {
        "bert": ("bert", {}, transformers.BertConfig, transformers.BertForPreTraining, BertForPreTraining),
        "roberta": ("roberta", {}, transformers.RobertaConfig, transformers.RobertaForMaskedLM, BertForPreTraining),
        "albert": ("albert", {}, transformers.AlbertConfig, transformers.AlbertForPreTraining, BertForPreTraining),
        "electra": ("electra", {}, transformers.ElectraConfig, transformers.ElectraForPreTraining,
                    BertForReplacedTokenDetection),
        "causal": ("bert", {"causal": True}, transformers.BertConfig, transformers.BertLMHeadModel,
                   BertForCausalLM),
    }
    model_type, extra, hf_config_cls, hf_cls, ours_cls = table[kind]
    config = family_config(model_type, **extra)
    theirs = randomize(hf_cls(hf_config_cls(**config.to_dict())), 20)
    with tempfile.TemporaryDirectory() as tmp:
        theirs.save_pretrained(tmp)
        ours = ours_cls.from_pretrained(tmp).eval()
    return ours, theirs, config


def check_family(kind: str):
    def check(ctx: Context, measured: dict) -> None:
        """bertkit's model of this family against transformers' on identical weights, float32, on the device:
        encoder output and head logits at the real positions, and the loss, within 1e-5."""
        ours, theirs, config = family_pair(kind)
        ours, theirs = ours.to(ctx.device), theirs.to(ctx.device)
        ids, mask, types, labels, nsp = padded_batch(config, ctx.device, lengths=(12, 8, 6), T=12, seed=21)
        real = mask.bool()
        tally = Tally(ATOL)
        with torch.no_grad():
            if kind == "causal":
                lm_labels = ids.masked_fill(mask == 0, -100)
                a = ours(ids, mask, types, labels=lm_labels)
                b = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=lm_labels,
                           use_cache=False)
                tally.add("logits", a.logits[real], b.logits[real])
                tally.add("loss", a.loss, b.loss)
            elif kind == "electra":
                replaced = (torch.rand(ids.shape, generator=torch.Generator().manual_seed(9)) < 0.3).long()
                replaced = replaced.to(ctx.device)
                a = ours(ids, mask, types, labels=replaced, output_hidden_states=True)
                b = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=replaced,
                           output_hidden_states=True)
                tally.add("sequence_output", a.hidden_states[-1][real], b.hidden_states[-1][real])
                tally.add("logits", a.logits[real], b.logits[real])
                tally.add("loss", a.loss, b.loss)
            else:
                kwargs = {} if kind == "roberta" else {"token_type_ids": types}
                pair = {"bert": "next_sentence_label", "albert": "sentence_order_label"}.get(kind)
                if pair:
                    kwargs[pair] = nsp
                a = ours(ids, mask, types if kind != "roberta" else None, labels=labels,
                         next_sentence_label=nsp if pair else None, output_hidden_states=True)
                b = theirs(input_ids=ids, attention_mask=mask, labels=labels, output_hidden_states=True, **kwargs)
                tally.add("sequence_output", a.hidden_states[-1][real], b.hidden_states[-1][real])
                theirs_logits = b.logits if kind == "roberta" else b.prediction_logits
                tally.add("mlm_logits", a.prediction_logits[real], theirs_logits[real])
                if pair:
                    tally.add("pair_logits", a.seq_relationship_logits,
                              b.seq_relationship_logits if kind == "bert" else b.sop_logits)
                tally.add("loss", a.loss, b.loss)
        tally.done(measured)
        summary(measured, f"{type(theirs).__name__}: max|diff| {tally.worst:.2e} (tol {ATOL:g})")

    check.__doc__ = check.__doc__.replace("this family", kind)
    return check


def check_distilbert(ctx: Context, measured: dict) -> None:
    """bertkit's BertForMaskedLM on a transformers DistilBertForMaskedLM directory (identical weights), float32, on
    the device: sequence output and MLM logits at the real positions and the loss, within 1e-5 (DistilBERT reads no
    token types)."""
    from bertkit.models import BertForMaskedLM

    transformers = _transformers()
    config = family_config("distilbert", hidden_act="gelu_new")
    theirs = randomize(transformers.DistilBertForMaskedLM(transformers.DistilBertConfig(**config.to_dict())), 12)
    with tempfile.TemporaryDirectory() as tmp:
        theirs.save_pretrained(tmp)
        ours = BertForMaskedLM.from_pretrained(tmp).eval()
    ours, theirs = ours.to(ctx.device), theirs.to(ctx.device)
    ids, mask, _, labels, _ = padded_batch(config, ctx.device, lengths=(12, 8, 6), T=12, seed=22)
    real = mask.bool()
    tally = Tally(ATOL)
    with torch.no_grad():
        a = ours(ids, mask, labels=labels, output_hidden_states=True)
        b = theirs(input_ids=ids, attention_mask=mask, labels=labels, output_hidden_states=True)
    tally.add("sequence_output", a.hidden_states[-1][real], b.hidden_states[-1][real])
    tally.add("mlm_logits", a.prediction_logits[real], b.logits[real])
    tally.add("loss", a.loss, b.loss)
    tally.done(measured)
    summary(measured, f"DistilBertForMaskedLM: max|diff| {tally.worst:.2e} (tol {ATOL:g})")


def check_t5(ctx: Context, measured: dict) -> None:
    """bertkit's T5ForConditionalGeneration on a transformers T5 1.1 directory (gated GELU, untied head, a deeper
    decoder; identical weights), float32, on the device: encoder output at the real positions, decoder logits and
    the loss on sources padded right and left and labels padded with -100, within 1e-5."""
    from bertkit.models import T5ForConditionalGeneration

    transformers = _transformers()
    hf_config = transformers.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=3,
                                      num_heads=4, relative_attention_num_buckets=8,
                                      relative_attention_max_distance=12, decoder_start_token_id=0,
                                      feed_forward_proj="gated-gelu", tie_word_embeddings=False, dropout_rate=0.0)
    theirs = randomize(transformers.T5ForConditionalGeneration(hf_config), 23)
    with torch.no_grad():  # transformers builds the head tied to the embeddings; its own weights untie it
        theirs.lm_head.weight = torch.nn.Parameter(torch.randn(100, 32, generator=torch.Generator().manual_seed(24)))
    with tempfile.TemporaryDirectory() as tmp:
        theirs.save_pretrained(tmp)
        ours = T5ForConditionalGeneration.from_pretrained(tmp).eval()
    ours, theirs = ours.to(ctx.device), theirs.to(ctx.device)
    g = torch.Generator().manual_seed(25)
    ids = torch.randint(2, 100, (3, 14), generator=g)
    mask = torch.ones(3, 14, dtype=torch.long)
    mask[1, 9:], mask[2, :4] = 0, 0  # row 1 padded on the right, row 2 on the left
    ids[mask == 0] = 0
    labels = torch.randint(2, 100, (3, 9), generator=g)
    labels[0, 6], labels[0, 7:], labels[1, 8], labels[2, 3], labels[2, 4:] = 1, -100, 1, 1, -100
    ids, mask, labels = ids.to(ctx.device), mask.to(ctx.device), labels.to(ctx.device)
    tally = Tally(ATOL)
    with torch.no_grad():
        a = ours(ids, mask, labels=labels)
        b = theirs(input_ids=ids, attention_mask=mask, labels=labels)
    real = mask.bool()
    tally.add("encoder_output", a.encoder_last_hidden_state[real], b.encoder_last_hidden_state[real])
    tally.add("logits", a.logits, b.logits)
    tally.add("loss", a.loss, b.loss)
    tally.done(measured)
    summary(measured, f"T5ForConditionalGeneration (1.1): max|diff| {tally.worst:.2e} (tol {ATOL:g})")


def check_xlnet(ctx: Context, measured: dict) -> None:
    """bertkit's XLNetLMHeadModel on a transformers XLNet directory (identical weights), float32, on the device:
    two segments, the second with the first's memory, a permutation mask and a target mapping (the query
    stream), left-padded rows and token types; logits and memories within 1e-5."""
    from bertkit.models import XLNetLMHeadModel

    transformers = _transformers()
    hf_config = transformers.XLNetConfig(vocab_size=99, d_model=32, n_layer=2, n_head=4, d_inner=37, mem_len=7,
                                         reuse_len=5, dropout=0.0, summary_last_dropout=0.0)
    theirs = randomize(transformers.XLNetLMHeadModel(hf_config), 26)
    with tempfile.TemporaryDirectory() as tmp:
        theirs.save_pretrained(tmp)
        ours = XLNetLMHeadModel.from_pretrained(tmp).eval()
    ours, theirs = ours.to(ctx.device), theirs.to(ctx.device)
    g = torch.Generator().manual_seed(27)
    B, T, P = 4, 10, 4
    segments = [torch.randint(6, 99, (B, T), generator=g) for _ in range(2)]
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, :3], mask[3, :1] = 0, 0  # XLNet pads on the left
    types = torch.zeros(B, T, dtype=torch.long)
    types[:, T // 2:], types[:, -1] = 1, 2
    perm = (torch.rand(B, T, T, generator=g) > 0.5).float()
    mapping = torch.zeros(B, P, T)
    for b in range(B):
        for p, t in enumerate(torch.randperm(T, generator=g)[:P].tolist()):
            mapping[b, p, t] = 1.0
    first, second, mask, types, perm, mapping = (t.to(ctx.device) for t in (*segments, mask, types, perm, mapping))
    for ids in (first, second):
        ids[mask == 0] = 5
    tally = Tally(ATOL)
    with torch.no_grad():
        a1 = ours(first, mask, types, use_mems=True)
        b1 = theirs(first, attention_mask=mask, token_type_ids=types, use_mems=True)
        a2 = ours(second, mask, types, mems=a1.mems, perm_mask=perm, target_mapping=mapping, use_mems=True)
        b2 = theirs(second, attention_mask=mask, token_type_ids=types, mems=b1.mems, perm_mask=perm,
                    target_mapping=mapping, use_mems=True)
    real = mask.bool()
    tally.add("segment1_logits", a1.logits[real], b1.logits[real])
    tally.add("segment2_query_logits", a2.logits, b2.logits)
    for i, (mine, theirs_mem) in enumerate(zip(a2.mems, b2.mems)):  # transformers' memories are (M, B, H)
        tally.add(f"mems{i}", mine, theirs_mem.transpose(0, 1))
    tally.done(measured)
    summary(measured, f"XLNetLMHeadModel, two segments with memory: max|diff| {tally.worst:.2e} (tol {ATOL:g})")


def check_modernbert(ctx: Context, measured: dict) -> None:
    """bertkit's ModernBertForMaskedLM on a transformers ModernBERT directory (identical weights; global and
    sliding-window layers, rows longer than the window, right and left padding), float32, on the device, on its
    unpadded path and its padded path: every hidden state and the MLM logits at the real positions and the loss,
    within 1e-5."""
    from bertkit.config import ModernBertConfig
    from bertkit.models import ModernBertForMaskedLM

    transformers = _transformers()
    config = ModernBertConfig(vocab_size=100, hidden_size=32, intermediate_size=24, num_hidden_layers=3,
                              num_attention_heads=4, global_attn_every_n_layers=2, local_attention=8,
                              max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                              cls_token_id=1, sep_token_id=2, global_rope_theta=1000.0, local_rope_theta=50.0)
    theirs = randomize(transformers.ModernBertForMaskedLM(
        transformers.ModernBertConfig(**config.to_dict(), attn_implementation="sdpa")), 28)
    with tempfile.TemporaryDirectory() as tmp:
        theirs.save_pretrained(tmp)
        ours = ModernBertForMaskedLM.from_pretrained(tmp).eval()
    ours, theirs = ours.to(ctx.device), theirs.to(ctx.device)
    g = torch.Generator().manual_seed(29)
    B, T = 4, 27
    ids = torch.randint(3, 100, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 21:], mask[2, 12:], mask[3, :5] = 0, 0, 0
    ids[mask == 0] = 0
    labels = torch.full((B, T), -100)
    labels[:, 6] = ids[:, 6]
    labels[0, 20] = 7
    ids, mask, labels = ids.to(ctx.device), mask.to(ctx.device), labels.to(ctx.device)
    real = mask.bool()
    tally = Tally(ATOL)
    with torch.no_grad():
        b = theirs(input_ids=ids, attention_mask=mask, labels=labels, output_hidden_states=True)
        for unpad in (True, False):
            ours.encoder.unpad = unpad
            a = ours(ids, mask, labels=labels, output_hidden_states=True)
            path = "unpadded" if unpad else "padded"
            for i, (x, y) in enumerate(zip(a.hidden_states, b.hidden_states)):
                tally.add(f"{path}/hidden_states{i}", x[real], y[real])
            tally.add(f"{path}/mlm_logits", a.prediction_logits[real], b.logits[real])
            tally.add(f"{path}/loss", a.loss, b.loss)
    tally.done(measured)
    summary(measured, f"ModernBertForMaskedLM, unpadded and padded: max|diff| {tally.worst:.2e} (tol {ATOL:g})")


# ------------------------------------------------------------------------------------------------------------------
# Several GPUs
# ------------------------------------------------------------------------------------------------------------------
def check_ddp(ctx: Context, measured: dict) -> None:
    """Several processes train like one: `bench/gpu/ddp_step.py` under torchrun, one process per GPU over NCCL,
    against one process with the same global batch; per-step losses of 3 steps within 1e-4 (reduction order of
    float32 sums differs between the two). Skipped on one GPU and on CPU (where tests/training/test_pretrain.py checks
    2 gloo processes); `BERTKIT_SUITE_DDP_CPU=2` runs it with 2 gloo processes on CPU."""
    cpu_processes = int(os.environ.get("BERTKIT_SUITE_DDP_CPU", "0"))
    if ctx.cuda:
        n = torch.cuda.device_count()
        if n < 2:
            raise Skip(f"{n} GPU visible: the multi-GPU step needs 2 or more")
        tol, backend = 1e-4, "nccl"
    elif cpu_processes >= 2:
        n, tol, backend = cpu_processes, 1e-5, "gloo"
    else:
        raise Skip("CPU run: NCCL needs 2+ GPUs (2 gloo processes: tests/training/test_pretrain.py, or "
                   "BERTKIT_SUITE_DDP_CPU=2)")
    rows_per_rank = 4
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT),
                                                         os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    timeout = max(60.0, min(240.0, ctx.remaining() - 60))
    with tempfile.TemporaryDirectory() as tmp:
        runs = {}
        for procs in (1, n):
            out = Path(tmp) / f"procs{procs}"
            args = ["--out", str(out), "--device", ctx.device.type, "--global-batch", str(rows_per_rank * n),
                    "--steps", "3"]
            command = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                        str(procs), str(ROOT / "bench" / "gpu" / "ddp_step.py"), *args])
            proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
            assert proc.returncode == 0, f"{procs} process(es) failed: {proc.stderr[-1500:]}"
            runs[procs] = step_losses(out)
    one, many = runs[1], runs[n]
    assert sorted(one) == sorted(many) == [1, 2, 3], (one, many)
    worst = max(abs(one[s] - many[s]) for s in one)
    measured.update(processes=n, backend=backend, global_batch=rows_per_rank * n, losses_one=one, losses_many=many,
                    max_abs_diff=worst, tolerance=tol)
    assert worst <= tol, f"{n} processes differ from 1 by {worst:.3g} (tol {tol:g})"
    summary(measured, f"{n} processes over {backend} = 1 process, max|diff| {worst:.1e} (tol {tol:g})")


# Every architecture of the table fine-tunes (ELMo on frozen features, T5 as text to text)
FINETUNE_FAMILIES = list(ARCHITECTURES)

CHECKS = [
    ("unpad_fp32", check_unpad_fp32),
    ("unpad_bf16", check_unpad_bf16),
    ("unpad_modernbert_bf16", check_modernbert_bf16),
    ("fused_qkv", check_fused_qkv),
    ("sparse_mlm", check_sparse_mlm),
    ("onednn_switch", check_onednn_switch),
    ("fused_adamw", check_fused_adamw),
    ("bf16_loss_curve", check_bf16_loss_curve),
    ("model_directory", check_model_directory),
    ("exact_resume", check_exact_resume),
    ("no_sync_steps", check_no_sync_steps),
    ("no_sync_task_steps", check_no_sync_task_steps),
    *[(f"no_sync_{name}", check_no_sync_row(objective, arch)) for name, objective, arch in objective_rows()],
    *[(f"no_sync_finetune_{family}", check_no_sync_finetune(family)) for family in FINETUNE_FAMILIES],
    *[(f"family_{kind}", check_family(kind)) for kind in ("bert", "roberta", "albert", "electra", "causal")],
    ("family_distilbert", check_distilbert),
    ("family_t5", check_t5),
    ("family_xlnet", check_xlnet),
    ("family_modernbert", check_modernbert),
    ("ddp_step", check_ddp),
]
