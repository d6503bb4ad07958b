"""Attention layouts: where the tokens sit while the layers run.

`Padded` is the plain layout (B, T, H), padding included, as transformers computes it. `Unpadded` is the fast one:
one flat (N, H) tensor of the real tokens, attention per sequence (groups of similar length, or a variable-length
FlashAttention kernel on a GPU: the `flash_attn` package's when installed, else PyTorch's own without dropout). `Encoded` carries an encoder's output in either
layout to the heads. Every architecture's attention runs through these, and tests pin the fast layout to the plain
one within 1e-5.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


def extended_attention_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, T) 1/0 mask -> (B, 1, 1, T) additive mask: 0 where attended, the dtype's minimum where padded."""
    mask = attention_mask[:, None, None, :].to(dtype)
    return (1.0 - mask) * torch.finfo(dtype).min


def attention_bias(attention_mask: torch.Tensor | None, causal: bool, T: int, dtype: torch.dtype,
                   device: torch.device, packed: bool = False) -> torch.Tensor | None:
    """What every layer adds to its attention scores on the padded path: (B, 1, 1, T) for padding; (B or 1, 1, T, T)
    when causal or packed.

    packed: `attention_mask` numbers the documents of each row (1, 2, ...; 0 = padding) and a token sees only the
    tokens of its own document. The causal part hides key j from query i when j > i. Parts are combined by a
    minimum, not a sum, so that a doubly hidden entry stays at the dtype's minimum instead of overflowing to -inf.
    """
    low = torch.finfo(dtype).min
    if attention_mask is None:
        mask = None
    elif packed:
        same = (attention_mask[:, :, None] == attention_mask[:, None, :]) & (attention_mask[:, None, :] > 0)
        mask = torch.zeros(same.shape, dtype=dtype, device=device).masked_fill(~same, low)[:, None]  # (B, 1, T, T)
    else:
        mask = extended_attention_mask(attention_mask, dtype)
    if not causal:
        return mask
    future = torch.ones(T, T, dtype=torch.bool, device=device).triu(1)  # (T, T): True above the diagonal
    bias = torch.zeros(T, T, dtype=dtype, device=device).masked_fill(future, low)[None, None]
    return bias if mask is None else torch.minimum(mask, bias)


class Padded:
    """The plain layout: activations (B, T, H), padding included; attention adds `bias` (or nothing).

    Every position is computed, as in transformers, so this layout reproduces it exactly, padding included. It is
    what a batch without padding uses (nothing to skip) and what `unpad=False` and `output_attentions` use.
    """

    def __init__(self, bias: torch.Tensor | None, causal: bool = False) -> None:
        self.bias = bias  # additive (B, 1, 1 or T, T), or None
        self.causal = causal and bias is None  # no bias: let the kernel apply the causal mask itself

    def attend(self, qkv: torch.Tensor, num_heads: int, dropout: float) -> torch.Tensor:
        """qkv: (B, T, 3H) queries, keys and values side by side -> context (B, T, H)."""
        q, k, v = _heads(qkv, num_heads)  # (B, A, T, D) each
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias, dropout_p=dropout,
                                                 is_causal=self.causal)
        B, T = qkv.shape[:2]
        return context.transpose(1, 2).reshape(B, T, -1)

    def probabilities(self, qkv: torch.Tensor, num_heads: int, dropout: float,
                      training: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """As `attend`, spelled out so that the (B, A, T, T) attention probabilities can be returned too."""
        q, k, v = _heads(qkv, num_heads)
        B, T = qkv.shape[:2]
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, A, T, T)
        if self.bias is not None:
            scores = scores + self.bias
        elif self.causal:
            scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        probs = scores.softmax(dim=-1)
        context = F.dropout(probs, dropout, training) @ v
        return context.transpose(1, 2).reshape(B, T, -1), probs


def _heads(qkv: torch.Tensor, num_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(S, L, 3H) -> queries, keys, values (S, A, L, D) each: views, no copy."""
    S, L, H3 = qkv.shape
    return qkv.view(S, L, 3, num_heads, H3 // (3 * num_heads)).permute(2, 0, 3, 1, 4).unbind(0)


def exporting() -> bool:
    """Whether torch.export is tracing the model (`bertkit.export`): the graph then takes every attention mask as
    a plain 0/1 padding mask on the padded path and skips the checks that read tensor values, since a traced graph
    cannot branch on them."""
    return bool(getattr(torch.compiler, "is_exporting", lambda: False)())


def checks_values(x: torch.Tensor) -> bool:
    """Whether the model checks the values of `x` (ids in range, rows selected, ...): on the CPU, where reading
    them is free; never on an accelerator (a read waits for the device) nor while exporting (a traced graph has
    no value checks)."""
    return not x.is_cuda and not exporting()


def check_ids(ids: torch.Tensor, name: str = "input_ids", shape: str = "(batch, seq_len)") -> None:
    """Refuse token ids that are not a 2-d integer tensor, naming the tensor `name` and the `shape` it must have."""
    if ids.dim() != 2:
        raise ValueError(f"{name} must be {shape}, got shape {tuple(ids.shape)}")
    if ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must be an integer tensor, got {ids.dtype}")


def check_ids_in_vocabulary(ids: torch.Tensor, vocab_size: int, name: str = "input_ids") -> None:
    """Refuse token ids outside [0, vocab_size), naming the tensor; only where `checks_values` (a device sync on
    an accelerator, where an out-of-range id fails loudly anyway)."""
    if ids.numel() and checks_values(ids):
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= vocab_size:
            raise ValueError(f"{name} contain id {high if high >= vocab_size else low} outside the vocabulary "
                             f"[0, {vocab_size}); does the tokenizer match the model?")


def attach_host(moved: torch.Tensor, host: torch.Tensor) -> torch.Tensor:
    """Remember `host`, the host tensor `moved` was copied from, on `moved` (returned): a model can then decide
    its layout from the host copy instead of reading the device (a wait for the device's queue on a GPU)."""
    moved._bertkit_host = host
    return moved


def host_copy(x: torch.Tensor | None) -> torch.Tensor | None:
    """The host tensor attached to `x` by `attach_host`, else None."""
    host = getattr(x, "_bertkit_host", None)
    return host if host is not None and host.shape == x.shape else None


def positions(where: torch.Tensor) -> torch.Tensor:
    """(n,) int64: the row-major flat indices of the True entries of bool `where` (any shape), on its device.

    From its host copy (`attach_host`) when it has one: the count n is then known on the host, and indexing with
    the result (index_select) reads nothing from the device, where `x[where]` or `where.nonzero()` would wait
    for the device's queue to learn n. Without one (a mask computed on the device), `nonzero`."""
    host = host_copy(where)
    if host is None:
        return where.reshape(-1).nonzero().squeeze(1)
    return _to_device(host.reshape(-1).nonzero().squeeze(1), where.device)


def host_count(n: int, device: torch.device) -> torch.Tensor:
    """A count known on the host as a 0-d float32 tensor on `device`, made there by a fill: a copy of a Python
    number from pageable memory to a GPU (`new_tensor(float(n))`) waits for the device's queue first."""
    return torch.full((), float(n), dtype=torch.float32, device=device)


def mark_host(derived: torch.Tensor, source: torch.Tensor, fn) -> torch.Tensor:
    """`derived` (returned), computed on the device as fn(source), remembering fn(the host copy of source) when
    `source` has one: e.g. the mask `labels != -100` of labels moved from the host."""
    host = host_copy(source)
    return attach_host(derived, fn(host)) if host is not None else derived


def reshape(x: torch.Tensor, *shape: int) -> torch.Tensor:
    """x.reshape(*shape), keeping its host copy (reshaped alike) when it has one: a (B, C, T) batch of choices
    flattened to (B * C, T) still lays out from the host."""
    return mark_host(x.reshape(*shape), x, lambda host: host.reshape(*shape))


def _to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`; to a GPU through pinned memory, so the copy waits for nothing."""
    if x.device == device:
        return x
    return (x.pin_memory() if device.type == "cuda" else x).to(device, non_blocking=True)


class Unpadded:
    """The fast layout: the real tokens of a padded (B, T) batch as one flat (N, H) tensor, grouped by sequence.

    A *sequence* is a row's real tokens, or, for a packed row (attention mask numbering its documents 1, 2, ...),
    one document. Linear layers, LayerNorm, activations and dropout then never touch padding. Attention runs per
    sequence: a variable-length FlashAttention kernel on GPU (bf16/fp16; `varlen_flash`) where one can take the
    activations; on a CPU in inference one SDPA call per sequence, without a mask; otherwise the
    sequences, sorted by length, are cut into up to `groups` groups, each laid out as (S_g, L_g, H) with L_g its
    own longest sequence, and PyTorch's SDPA runs on each with a key-padding mask. So attention costs about the
    sum of the squared lengths, not S x T^2. Either way no token attends across sequences or to
    padding.
    """

    groups = 4  # attention groups of similar length (more: less padding in attention, more kernel calls)

    def __init__(self, attention_mask: torch.Tensor, packed: bool, causal: bool) -> None:
        B, T = attention_mask.shape
        device = attention_mask.device
        flat = attention_mask.reshape(-1)
        real = flat.nonzero().squeeze(1)  # (N,) row-major positions of the real tokens
        if packed:  # one sequence per (row, document); a document's tokens need not be contiguous in its row
            key = (real // T) * (int(flat.max()) + 1) + flat[real]
            key, order = torch.sort(key, stable=True)
            real = real[order]
        else:
            key = real // T
        counts = torch.unique_consecutive(key, return_counts=True)[1]  # (S,) tokens per sequence
        S, N = counts.numel(), real.numel()
        starts = torch.cumsum(counts, 0) - counts
        sequence = torch.repeat_interleave(torch.arange(S, device=device), counts)  # (N,)
        self.batch_shape = (B, T)
        self.index = real  # (N,) flat position b * T + t of each token, sequence by sequence
        self.max_len = int(counts.max()) if S else 0
        self.cu_seqlens = F.pad(torch.cumsum(counts, 0), (1, 0)).to(torch.int32)  # (S + 1,) FlashAttention's offsets
        self.num_sequences = S
        self.causal = causal
        # Attention groups: sequences by decreasing length, cut into equal counts; group g is laid out as
        # (S_g, L_g) at rows [offset_g, offset_g + S_g * L_g) of one buffer, sequence s of it at `base[s]`.
        by_length = torch.argsort(counts, descending=True, stable=True)
        base = torch.zeros(S, dtype=torch.long, device=device)
        self.layout: list[tuple[int, int, torch.Tensor]] = []  # (S_g, L_g, (S_g, 1, 1 or L_g, L_g) bool mask)
        offset = 0
        for members in torch.tensor_split(by_length, min(S, self.groups)) if S else ():
            lengths = counts[members]
            S_g, L_g = members.numel(), int(lengths[0])
            base[members] = offset + torch.arange(S_g, device=device) * L_g
            mask = (torch.arange(L_g, device=device)[None, :] < lengths[:, None])[:, None, None, :]
            if causal:
                mask = mask & torch.ones(L_g, L_g, dtype=torch.bool, device=device).tril()
            self.layout.append((S_g, L_g, mask))
            offset += S_g * L_g
        self.total = offset  # rows of the laid-out buffer
        self.slot = base[sequence] + (torch.arange(N, device=device) - starts[sequence])  # (N,) row of each token
        unused = torch.ones(offset, dtype=torch.bool, device=device)
        unused[self.slot] = False
        self.empty = unused.nonzero().squeeze(1)  # rows of the buffer that hold no token (zeroed, never attended)
        self._row_of: torch.Tensor | None = None
        self._biases: list[torch.Tensor] | None = None
        self._lengths: list[int] | None = None  # tokens per sequence, on the host (`attend_each`)

    @classmethod
    def build(cls, attention_mask: torch.Tensor, packed: bool, causal: bool,
              host: torch.Tensor | None = None) -> "Unpadded":
        """The layout of `attention_mask`; with `host` (its host copy, see `attach_host`), built on the host from it
        and then moved to the mask's device: the sizes it needs (sequence lengths, group widths) are then host
        reads, not device reads."""
        if host is None or host.device == attention_mask.device:
            return cls(attention_mask if host is None else host, packed, causal)
        layout = cls(host, packed, causal)
        device = attention_mask.device
        for name in ("index", "cu_seqlens", "slot", "empty"):
            setattr(layout, name, _to_device(getattr(layout, name), device))
        layout.layout = [(S_g, L_g, _to_device(mask, device)) for S_g, L_g, mask in layout.layout]
        return layout

    def key_biases(self, dtype: torch.dtype) -> list[torch.Tensor]:
        """The groups' masks as additive masks: 0 where attended, the dtype's minimum elsewhere (built once)."""
        if self._biases is None or self._biases[0].dtype != dtype:
            low = torch.finfo(dtype).min
            self._biases = [torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(~m, low)
                            for _, _, m in self.layout]
        return self._biases

    def gather(self, grid: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) or (T,) broadcast over rows -> (N, ...) at the real tokens."""
        B, T = self.batch_shape
        return grid.expand(B, T, *grid.shape[2:]).reshape(B * T, *grid.shape[2:])[self.index]

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(N, H) -> (B, T, H) with zeros at padding."""
        B, T = self.batch_shape
        return x.new_zeros(B * T, x.shape[-1]).index_copy(0, self.index, x).view(B, T, x.shape[-1])

    def rows(self, where: torch.Tensor) -> torch.Tensor:
        """Flat positions (b * T + t) -> rows of the (N, H) tensor; -1 where the position is padding."""
        if self._row_of is None:
            B, T = self.batch_shape
            self._row_of = torch.full((B * T,), -1, dtype=torch.long, device=self.index.device)
            self._row_of[self.index] = torch.arange(self.index.numel(), device=self.index.device)
        return self._row_of[where]

    def attend(self, qkv: torch.Tensor, num_heads: int, dropout: float) -> torch.Tensor:
        """qkv: (N, 3H) queries, keys and values side by side -> context (N, H): a variable-length kernel where one
        takes them (GPU), one SDPA call per sequence on a CPU without gradients (`attend_each`: inference), else
        the length groups (`attend_groups`)."""
        context = varlen_flash(qkv, num_heads, self.cu_seqlens, self.max_len, dropout, causal=self.causal)
        if context is not None:
            return context
        if qkv.device.type == "cpu" and not (torch.is_grad_enabled() and qkv.requires_grad):
            return self.attend_each(qkv, num_heads, dropout)
        return self.attend_groups(qkv, num_heads, dropout)

    def attend_each(self, qkv: torch.Tensor, num_heads: int, dropout: float) -> torch.Tensor:
        """Attention sequence by sequence: a sequence's rows of qkv are consecutive, so each is a view (`split`,
        whose gradient is a concatenation), run through SDPA without a mask and without a copy in and out of a
        padded buffer. On a CPU, in inference, this beats the masked length groups at every batch shape measured
        (all-MiniLM-L6-v2's widths, EPYC Zen 4, one thread: 5 texts of 23-256 tokens 3.4 against 4.7 ms per layer,
        64 of 8-40 tokens 5.2 against 7.9 ms). Training keeps the groups: forward and backward were faster this way
        at MiniLM's widths (32 texts of 8-128 tokens: 35 against 49 ms), but the main job's pretraining step (128
        wide, two heads, rows packed with many short documents: a call per document, forward and backward) ran
        7-10% slower. On a GPU the kernel launches would cost more than they save."""
        H = qkv.shape[1] // 3
        D = H // num_heads
        if self._lengths is None:
            self._lengths = self.cu_seqlens.diff().tolist()
        if not self._lengths:
            return qkv.new_zeros(0, H)
        contexts = []
        for part in qkv.split(self._lengths):
            L = part.shape[0]
            q, k, v = part.view(1, L, 3, num_heads, D).permute(2, 0, 3, 1, 4).unbind(0)  # (1, A, L, D) each
            context = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=self.causal)
            contexts.append(context.transpose(1, 2).reshape(L, H))
        return contexts[0] if len(contexts) == 1 else torch.cat(contexts)

    def attend_groups(self, qkv: torch.Tensor, num_heads: int, dropout: float) -> torch.Tensor:
        """Attention on the length groups: each laid out as (S_g, L_g) with a key-padding mask."""
        H = qkv.shape[1] // 3
        laid_out = FillSlots.apply(qkv, self.slot, self.total, self.empty)  # (total, 3H)
        # With dropout the CPU kernel is the math one, fastest with a bool mask; without, an additive mask.
        masks = [m for _, _, m in self.layout] if dropout > 0 else self.key_biases(qkv.dtype)
        contexts = []
        parts = laid_out.split([S_g * L_g for S_g, L_g, _ in self.layout])
        for (S_g, L_g, _), part, mask in zip(self.layout, parts, masks):
            q, k, v = _heads(part.view(S_g, L_g, 3 * H), num_heads)  # (S_g, A, L_g, D) each
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
            contexts.append(context.transpose(1, 2).reshape(S_g * L_g, H))
        context = contexts[0] if len(contexts) == 1 else torch.cat(contexts)
        return ReadSlots.apply(context, self.slot)


class FillSlots(torch.autograd.Function):
    """(N, C) rows -> (M, C) zeros with row i at `slot[i]`. The slots are distinct, so the gradient is a gather
    (autograd's generic rule for index_copy/index_select would scatter-add, several times slower on CPU)."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, slot: torch.Tensor, total: int, empty: torch.Tensor) -> torch.Tensor:
        """empty: the slots no row goes to; only those are zeroed (keys and values there must be finite)."""
        ctx.save_for_backward(slot)
        return rows.new_empty(total, rows.shape[1]).index_fill_(0, empty, 0.0).index_copy_(0, slot, rows)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (slot,) = ctx.saved_tensors
        return grad.index_select(0, slot), None, None, None


class ReadSlots(torch.autograd.Function):
    """(M, C) -> its rows `slot` (N, C); the inverse of FillSlots, and its gradient is FillSlots."""

    @staticmethod
    def forward(ctx, laid_out: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(slot)
        ctx.total = laid_out.shape[0]
        return laid_out.index_select(0, slot)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (slot,) = ctx.saved_tensors
        return grad.new_zeros(ctx.total, grad.shape[1]).index_copy_(0, slot, grad), None


try:  # optional: FlashAttention-2's variable-length kernel (CUDA, fp16/bf16, dropout too); never required
    from flash_attn import flash_attn_varlen_func as flash_attn_varlen
except ImportError:  # the usual case, and always on CPU
    flash_attn_varlen = None


def _torch_varlen():
    """PyTorch's own variable-length FlashAttention (`torch.nn.attention.varlen.varlen_attn`, CUDA, fp16/bf16, no
    dropout) where this torch has it with a `window_size` argument, else None."""
    try:
        import inspect

        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn if "window_size" in inspect.signature(varlen_attn).parameters else None


def __getattr__(name: str):
    """`layouts.torch_varlen`, resolved on first use (PEP 562): importing torch.nn.attention.varlen pulls in
    torch._dynamo, about 2 s of every command's start on a CPU that never calls it. Tests and the GPU suite
    replace the attribute; the model reads it through `_varlen_kernel`."""
    if name == "torch_varlen":
        globals()[name] = _torch_varlen()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _varlen_kernel():
    """PyTorch's variable-length kernel (or what replaced `torch_varlen`), resolving it the first time."""
    return globals()["torch_varlen"] if "torch_varlen" in globals() else __getattr__("torch_varlen")


def use_flash_attn(q: torch.Tensor) -> bool:
    """Whether a FlashAttention kernel can take these activations (when one is there): CUDA, fp16 or bf16."""
    return q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)


def varlen_kernel_available(t: torch.Tensor) -> bool:
    """Whether a variable-length FlashAttention kernel exists for tensors on t's device (dtype aside)."""
    return t.is_cuda and (flash_attn_varlen is not None or _varlen_kernel() is not None)


def varlen_flash(qkv: torch.Tensor, num_heads: int, cu_seqlens: torch.Tensor, max_len: int, dropout: float,
                 causal: bool = False, window: int | None = None) -> torch.Tensor | None:
    """Attention of (N, 3H) queries, keys and values of sequences laid end to end (`cu_seqlens`, int32) -> (N, H)
    through a variable-length FlashAttention kernel, or None where none can take them (the caller's SDPA path
    runs). The `flash_attn` package's kernel first (any dropout), else PyTorch's own (no dropout: inference, and
    training with attention dropout 0). `window`: each query sees keys at most that far either side."""
    if not use_flash_attn(qkv):
        return None
    N, H = qkv.shape[0], qkv.shape[1] // 3
    D = H // num_heads
    q, k, v = qkv.view(N, 3, num_heads, D).unbind(1)  # (N, A, D) each
    if flash_attn_varlen is not None:
        extra = {} if window is None else {"window_size": (window, window)}
        context = flash_attn_varlen(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len, dropout_p=dropout,
                                    causal=causal, **extra)
    elif (torch_varlen := _varlen_kernel()) is not None and dropout == 0.0 and D % 8 == 0 and D <= 256:
        if window is not None:
            span = (window, 0 if causal else window)
        else:
            span = (-1, 0 if causal else -1)
        context = torch_varlen(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len, window_size=span)
    else:
        return None
    return context.reshape(N, H)


@dataclass
class Encoded:
    """The encoder's output before it is laid out for a head: `hidden` is (B, T, H), or (N, H) when `tokens`
    (the unpadded layout) is set. Heads take what they need: all positions, some positions, or each row's first."""

    hidden: torch.Tensor
    tokens: Unpadded | None
    hidden_states: tuple[torch.Tensor, ...] | None = None  # always (B, T, H) each
    attentions: tuple[torch.Tensor, ...] | None = None

    def padded(self) -> torch.Tensor:
        """(B, T, H); zeros at padding positions when unpadded."""
        return self.hidden if self.tokens is None else self.tokens.pad(self.hidden)

    def select(self, where: torch.Tensor) -> torch.Tensor:
        """(B, T) bool -> (n, H) at the n selected positions, in row-major order; they must be real tokens."""
        at = positions(where)  # from the host copy of `where` when it has one: no device read
        if self.tokens is None:
            return self.hidden.flatten(0, 1).index_select(0, at)
        rows = self.tokens.rows(at)
        if rows.numel() and checks_values(rows) and int(rows.min()) < 0:
            raise ValueError("predict_at selects padding positions (attention_mask 0); predict at real tokens only")
        return self.hidden[rows]

    def first(self) -> torch.Tensor:
        """(B, H): the vector at position 0 of every row ([CLS]), zeros for a row that starts with padding."""
        if self.tokens is None:
            return self.hidden[:, 0]
        B, T = self.tokens.batch_shape
        rows = self.tokens.rows(torch.arange(B, device=self.hidden.device) * T)
        picked = self.hidden[rows.clamp(min=0)]
        return torch.where((rows >= 0)[:, None], picked, torch.zeros_like(picked))
