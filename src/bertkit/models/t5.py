"""T5, the text-to-text encoder-decoder: an encoder over the input, a decoder that writes the output token by token.

Read it top to bottom: the relative position buckets, the RMS norm, attention (self and cross, with the decoder's
key/value cache), the feed-forward block, one layer, a stack of layers, then the models and generation (greedy,
sampling, beam search). Shapes use B = batch, S = source (encoder) length, T = target (decoder) length,
d = d_model, A = heads, D = d_kv (the head size; A * D need not be d), F = d_ff, V = vocabulary, K = beams.

What makes T5 differ from BERT, each where it acts:

    positions       no position embeddings: every attention score gets a learned scalar per head and per bucket
                    of relative distance (exact buckets near, logarithmic ones far, one bucket past
                    relative_attention_max_distance). Each stack computes its bias once and shares it across its
                    layers (on disk the table belongs to the stack's first layer); the encoder's buckets tell
                    left from right, the decoder's only look back.
    norms           RMS norm: scale only, no mean subtraction, no bias, the variance in float32; pre-norm
                    residuals (x + sublayer(norm(x))) and one final norm per stack
    attention       no biases anywhere and no 1/sqrt(D) on the scores: the query weights' initial standard
                    deviation carries that factor instead
    feed-forward    feed_forward_proj "relu": wi -> ReLU -> wo (T5 1.0); "gated-gelu": GELU(wi_0) * wi_1 -> wo
                    with the tanh GELU (T5 1.1)
    embeddings      one matrix shared by the encoder input, the decoder input and, when tied (T5 1.0), the
                    output projection; tied, the decoder output is first scaled by d**-0.5
    decoder input   the labels shifted right behind decoder_start_token_id (T5: the padding id)

transformers' T5 directories load here and ours load there: `bertkit.checkpoint` maps the names (the decoder and
the output projection are the "seq2seq" head over the encoder, so T5EncoderModel reads a full directory too).

Fast paths for training (`set_fast_paths`, pinned to the plain path within 1e-5 by tests/models/
test_t5_fastpaths.py): `forward(..., at_labels=True)` packs the batch (`pack`: several examples per row, sources
and targets alike, each position seeing only its own example through a block-diagonal additive mask; T5 has no
absolute positions, so the relative bias of a packed example is the one it has alone), computes the output
projection at the real labels only, and runs the attention projections as one matmul and the linear layers on
oneDNN. (`bertkit.models.layouts.Unpadded`, BERT's layout, takes no per-head position bias, hence packing here.)
Generation and the ordinary forward run on the padded (B, T, d) layout, as transformers does.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.config import IGNORE_INDEX, T5Config
from bertkit.models.bert import PreTrainedModel, token_loss
from bertkit.models.kernels import Linear, activation, linear
from bertkit.models.layouts import attention_bias, check_ids, check_ids_in_vocabulary, host_copy, mark_host, positions


# ------------------------------------------------------------------------------------------------------------------
# Outputs
# ------------------------------------------------------------------------------------------------------------------
@dataclass
class T5EncoderOutput:
    """What `T5EncoderModel.forward` returns."""

    last_hidden_state: torch.Tensor  # (B, S, d) after the final norm
    # L+1 tensors (B, S, d): the embeddings, then every layer's output, the last one after the final norm (which
    # makes it last_hidden_state), as transformers' output_hidden_states gives them
    hidden_states: tuple[torch.Tensor, ...] | None = None


@dataclass
class Seq2SeqOutput:
    """What `T5ForConditionalGeneration.forward` returns; `loss` is None without labels."""

    loss: torch.Tensor | None  # mean cross-entropy over the labels that are not IGNORE_INDEX
    logits: torch.Tensor  # (B, T, V) scores for the next target token at every decoder position
    encoder_last_hidden_state: torch.Tensor  # (B, S, d)


# ------------------------------------------------------------------------------------------------------------------
# Blocks
# ------------------------------------------------------------------------------------------------------------------
def relative_position_bucket(relative_position: torch.Tensor, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> torch.Tensor:
    """Bucket of each relative position (key position - query position), an integer tensor of any shape.

    Bidirectional (encoder): half the buckets for keys after the query, half for keys before. Unidirectional
    (decoder): keys after the query all fall in bucket 0, which the causal mask hides anyway. Within a
    direction, the first half of the buckets are the exact distances 0, 1, ...; the second half cover larger
    distances on a log scale up to `max_distance`, beyond which all share the last bucket. The float arithmetic is
    Mesh TensorFlow's, step for step, so every distance lands where the released checkpoints expect it.
    """
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = -torch.clamp(relative_position, max=0)  # looking back only: distance >= 0
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    # Far distances: log-spaced between max_exact and max_distance (small ones compute garbage here, unused).
    far = max_exact + (torch.log(distance.float() / max_exact) / math.log(max_distance / max_exact)
                       * (num_buckets - max_exact)).long()
    far = torch.clamp(far, max=num_buckets - 1)
    return buckets + torch.where(is_small, distance, far)


class RMSNorm(nn.Module):
    """T5's layer norm: x / sqrt(mean(x^2) + eps) * weight, with no mean subtracted and no bias.

    The mean square is taken in float32 whatever the activations' dtype; a half-precision weight brings the result
    back to its dtype (transformers' rule, so bf16 checkpoints compute alike).
    """

    is_norm = True  # the trainer decays no norm scale

    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)  # (..., 1)
        x = x * torch.rsqrt(variance + self.eps)
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            x = x.to(self.weight.dtype)
        return self.weight * x


class Attention(nn.Module):
    """Multi-head attention without biases or score scaling; self-attention, or cross-attention over the encoder.

    Keys and values are projected by `keys_values` and attended by `attend`, apart, so that the decoder can keep
    them in its cache: self-attention appends one position per generated token, cross-attention projects the
    encoder output once. `fused_qkv` (a fast path, `set_fast_paths`) runs the projections that read the same input
    as one matmul over their stacked weights (the three tensors stay apart, as on disk).
    """

    fused_qkv = True

    def __init__(self, config: T5Config) -> None:
        super().__init__()
        d, inner = config.d_model, config.inner_dim
        self.num_heads, self.head_size = config.num_heads, config.d_kv
        self.query = Linear(d, inner, bias=False)
        self.key = Linear(d, inner, bias=False)
        self.value = Linear(d, inner, bias=False)
        self.out = Linear(inner, d, bias=False)
        self.dropout = config.dropout_rate

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, A*D) -> (B, A, L, D)."""
        B, L, _ = x.shape
        return x.view(B, L, self.num_heads, self.head_size).transpose(1, 2)

    def project(self, x: torch.Tensor, queries: bool = True) -> list[torch.Tensor]:
        """(B, L, d) -> [queries,] keys, values (B, A, L, D) each."""
        projections = [self.query, self.key, self.value] if queries else [self.key, self.value]
        if not self.fused_qkv:
            return [self._heads(projection(x)) for projection in projections]
        weight = torch.cat([projection.weight for projection in projections])  # (n * A*D, d)
        return [self._heads(part) for part in linear(x, weight, onednn=self.key.onednn).chunk(len(projections), -1)]

    def keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, L, d) -> keys and values (B, A, L, D) each."""
        keys, values = self.project(x, queries=False)
        return keys, values

    def attend(self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor | None,
               queries: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, d) queries over keys/values (B, A, L, D); bias: additive (B or 1, A or 1, T, L): the position
        bias and the masks; queries (B, A, T, D) when already projected from x. Returns (B, T, d)."""
        q = self._heads(self.query(x)) if queries is None else queries  # (B, A, T, D)
        if bias is not None and bias.dtype != q.dtype:
            bias = bias.to(q.dtype)
        dropout = self.dropout if self.training else 0.0
        # scale=1.0: T5 scores are plain dot products (the 1/sqrt(D) lives in the query initialisation).
        context = F.scaled_dot_product_attention(q, keys, values, attn_mask=bias, dropout_p=dropout, scale=1.0)
        B, _, T, _ = context.shape
        return self.out(context.transpose(1, 2).reshape(B, T, -1))  # (B, A, T, D) -> (B, T, A*D) -> (B, T, d)


def tanh_gelu(x: torch.Tensor) -> torch.Tensor:
    """The tanh GELU of T5 1.1 spelled out as transformers' gelu_new computes it, operation for operation: torch's
    fused F.gelu(approximate="tanh") rounds differently in the last bits, which grow to ~1e-5 in large logits."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class FeedForward(nn.Module):
    """d -> F -> d: ReLU (T5 1.0), or the tanh-GELU-gated product of two projections (T5 1.1); dropout before the
    output projection."""

    def __init__(self, config: T5Config) -> None:
        super().__init__()
        d, ff = config.d_model, config.d_ff
        # Names on disk: wi (ReLU's input), wi_0 (the activated branch), wi_1 (the linear branch), wo.
        self.up = None if config.gated else Linear(d, ff, bias=False)
        self.gate = Linear(d, ff, bias=False) if config.gated else None
        self.linear = Linear(d, ff, bias=False) if config.gated else None
        self.down = Linear(ff, d, bias=False)
        self.act = tanh_gelu if config.activation == "gelu_new" else activation(config.activation)
        self.dropout = nn.Dropout(config.dropout_rate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.up(x)) if self.gate is None else self.act(self.gate(x)) * self.linear(x)  # (..., F)
        return self.down(self.dropout(h))


class DecoderCache:
    """The decoder's keys and values during generation, per layer: self-attention's, one position longer after
    every step, and cross-attention's, projected from the encoder output at the first step and reused."""

    def __init__(self, num_layers: int) -> None:
        self.self_kv: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * num_layers
        self.cross_kv: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * num_layers

    @property
    def length(self) -> int:
        """Target positions already seen (the offset of the next position)."""
        return 0 if self.self_kv[0] is None else self.self_kv[0][0].shape[2]

    def reorder(self, rows: torch.Tensor) -> None:
        """Keep the batch rows `rows` (B',) in this order: beam search continues some beams twice, drops others."""
        for kv in (self.self_kv, self.cross_kv):
            for i, pair in enumerate(kv):
                if pair is not None:
                    kv[i] = (pair[0].index_select(0, rows), pair[1].index_select(0, rows))


class Layer(nn.Module):
    """One T5 layer: self-attention, cross-attention over the encoder output (decoder only), feed-forward; each
    is pre-norm with a residual and dropout on its output."""

    def __init__(self, config: T5Config, cross: bool) -> None:
        super().__init__()
        eps = config.layer_norm_epsilon
        self.attn_norm = RMSNorm(config.d_model, eps)
        self.attn = Attention(config)
        self.cross_norm = RMSNorm(config.d_model, eps) if cross else None
        self.cross = Attention(config) if cross else None
        self.ffn_norm = RMSNorm(config.d_model, eps)
        self.ffn = FeedForward(config)
        self.dropout = nn.Dropout(config.dropout_rate)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None, memory: torch.Tensor | None = None,
                memory_bias: torch.Tensor | None = None, cache: DecoderCache | None = None,
                index: int = 0) -> torch.Tensor:
        """x: (B, T, d); bias: the stack's (B or 1, A, T, L) position bias plus masks. Decoder: memory (B, S, d) is
        the encoder output, memory_bias its (B, 1, 1, S) padding mask; with a cache, x holds the new positions
        only and this layer's (index) keys and values are read from and written to it."""
        h = self.attn_norm(x)
        q, k, v = self.attn.project(h)  # (B, A, T, D) each
        if cache is not None:
            if cache.self_kv[index] is not None:
                past_k, past_v = cache.self_kv[index]
                k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)  # (B, A, past + T, D)
            cache.self_kv[index] = (k, v)
        x = x + self.dropout(self.attn.attend(h, k, v, bias, q))
        if self.cross is not None:
            h = self.cross_norm(x)
            if cache is not None and cache.cross_kv[index] is not None:
                k, v = cache.cross_kv[index]
            else:
                k, v = self.cross.keys_values(memory)  # (B, A, S, D)
                if cache is not None:
                    cache.cross_kv[index] = (k, v)
            x = x + self.dropout(self.cross.attend(h, k, v, memory_bias))
        return x + self.dropout(self.ffn(self.ffn_norm(x)))


def padding_bias(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """(B, L) 1 = attend / 0 = padding -> additive (B, 1, 1, L): 0 or the dtype's minimum; None stays None."""
    if mask is None:
        return None
    return (1.0 - mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


class Stack(nn.Module):
    """The encoder (bidirectional) or the decoder (causal, with cross-attention): embedded tokens -> layers -> final
    norm. The embeddings are the model's shared matrix, applied by the model, so the stack holds no copy.

    `unpad` (a fast path, `set_fast_paths`) lets the model train on packed rows (`pack`): several sequences per row,
    each seeing only itself. T5 has no absolute positions, so a packed sequence computes what it does alone: the
    relative bias of two of its tokens depends only on their distance, the same in the packed row.
    """

    unpad = True

    def __init__(self, config: T5Config, decoder: bool) -> None:
        super().__init__()
        self.config, self.is_decoder = config, decoder
        # One scalar per (bucket, head), shared by every layer of the stack.
        self.position_bias = nn.Embedding(config.relative_attention_num_buckets, config.num_heads)
        layers = config.decoder_layers if decoder else config.num_layers
        self.layers = nn.ModuleList(Layer(config, cross=decoder) for _ in range(layers))
        self.final_norm = RMSNorm(config.d_model, config.layer_norm_epsilon)
        self.dropout = nn.Dropout(config.dropout_rate)

    def relative_bias(self, query_length: int, key_length: int, offset: int = 0) -> torch.Tensor:
        """(1, A, Tq, Tk): the learned bias of every (query, key) pair; queries sit at positions offset, offset + 1,
        ... (the decoder's new positions after `offset` cached ones), keys at 0 .. key_length - 1."""
        device = self.position_bias.weight.device
        queries = torch.arange(query_length, device=device)[:, None] + offset  # (Tq, 1)
        keys = torch.arange(key_length, device=device)[None, :]  # (1, Tk)
        buckets = relative_position_bucket(keys - queries, not self.is_decoder,
                                           self.config.relative_attention_num_buckets,
                                           self.config.relative_attention_max_distance)  # (Tq, Tk)
        return self.position_bias(buckets).permute(2, 0, 1)[None]  # (Tq, Tk, A) -> (1, A, Tq, Tk)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, memory: torch.Tensor | None = None,
                memory_mask: torch.Tensor | None = None, cache: DecoderCache | None = None,
                output_hidden_states: bool = False, segments: torch.Tensor | None = None,
                memory_segments: torch.Tensor | None = None) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """x: (B, T, d) embedded tokens; mask: (B, T) 1 = token, 0 = padding (the decoder: (B, past + T) with a
        cache). Decoder: memory (B, S, d) encoder output and memory_mask (B, S). Returns (B, T, d) after the final
        norm, and the L+1 hidden states (embeddings, every layer; the last one normed) when asked.

        Packed rows (`pack`, no cache): segments (B, T) numbers the sequence of every position (0 = padding) in
        place of mask, and memory_segments (B, S) those of the memory in place of memory_mask; a position sees the
        positions of its own sequence only (the decoder's, up to itself), in the memory too."""
        B, T, _ = x.shape
        dtype = self.position_bias.weight.dtype
        past = cache.length if cache is not None else 0
        bias = self.relative_bias(T, past + T, past)  # (1, A, T, past + T)
        if segments is not None:
            # Within a sequence, position differences are the packed row's: the plain bias, cut to the sequence.
            bias = bias + attention_bias(segments, self.is_decoder, T, dtype, x.device, packed=True)  # (B, A, T, T)
        elif self.is_decoder:
            # Key j is hidden from the query at position past + i when j > past + i; padding (if any) also hidden.
            keys = torch.arange(past + T, device=x.device)
            visible = (keys[None, :] <= torch.arange(T, device=x.device)[:, None] + past)[None, None]  # (1,1,T,L)
            if mask is not None:
                visible = visible & (mask[:, None, None, :] != 0)  # (B, 1, T, L)
            bias = bias.masked_fill(~visible, torch.finfo(dtype).min)
        elif mask is not None:
            bias = bias + padding_bias(mask, dtype)  # (B, A, T, T)
        memory_bias = padding_bias(memory_mask, dtype) if self.is_decoder else None
        if memory_segments is not None:  # (B, 1, T, S): a decoder sequence reads its own source only
            same = (segments[:, :, None] == memory_segments[:, None, :]) & (memory_segments[:, None, :] > 0)
            memory_bias = torch.zeros(same.shape, dtype=dtype, device=x.device).masked_fill(
                ~same, torch.finfo(dtype).min)[:, None]
        x = self.dropout(x)
        hidden_states = [x] if output_hidden_states else None
        for i, layer in enumerate(self.layers):
            x = layer(x, bias, memory, memory_bias, cache, i)
            if hidden_states is not None and i < len(self.layers) - 1:
                hidden_states.append(x)
        out = self.dropout(self.final_norm(x))
        if hidden_states is not None:  # the last layer's entry is the stack's output, as transformers gives it
            hidden_states.append(out)
        return out, tuple(hidden_states) if hidden_states is not None else None


@dataclass
class Packing:
    """Where the examples of a padded training batch sit once packed: several examples per row, sources and targets
    alike (example i's source in the same row of the packed sources as its target in the packed targets).

    Positions are flat: b * L + t in a (B, L) grid. `*_from` lists every real position of the padded batch (row by
    row), `*_to` where it goes in the packed (R, L') one; `*_segments` (R, L') hold 1 + the example's row in the
    padded batch at its positions, 0 at padding.
    """

    source_from: torch.Tensor
    source_to: torch.Tensor
    source_segments: torch.Tensor
    target_from: torch.Tensor
    target_to: torch.Tensor
    target_segments: torch.Tensor

    def to(self, device: torch.device) -> "Packing":
        """The packing's index tensors on `device` (a GPU: from pinned memory, a copy that waits for nothing)."""
        if self.source_from.device == device:
            return self
        move = ((lambda x: x.pin_memory().to(device, non_blocking=True)) if device.type == "cuda" else
                (lambda x: x.to(device)))
        return Packing(*(move(getattr(self, f.name)) for f in dataclasses.fields(self)))

    def gather(self, padded: torch.Tensor, source: bool) -> torch.Tensor:
        """(B, L, ...) padded -> (R, L', ...) packed; zeros at padding."""
        where_from, where_to, segments = ((self.source_from, self.source_to, self.source_segments) if source else
                                          (self.target_from, self.target_to, self.target_segments))
        flat = padded.reshape(-1, *padded.shape[2:])
        packed = flat.new_zeros(segments.numel(), *padded.shape[2:])
        packed[where_to] = flat[where_from]
        return packed.view(*segments.shape, *padded.shape[2:])


def _labelled(labels: torch.Tensor) -> torch.Tensor:
    return labels != IGNORE_INDEX


def _spans(lengths: list[int], rows: list[int], offsets: list[int], width: int, device) -> torch.Tensor:
    """Flat positions row * width + offset + 0 .. length - 1 of every span, in order."""
    lengths_t = torch.tensor(lengths, dtype=torch.long, device=device)
    starts = torch.tensor([r * width + o for r, o in zip(rows, offsets)], dtype=torch.long, device=device)
    total = int(lengths_t.sum())
    first = torch.cumsum(lengths_t, 0) - lengths_t  # where each span starts among the positions
    return torch.repeat_interleave(starts - first, lengths_t, output_size=total) + torch.arange(total, device=device)


def _first_fit(n: list[int], m: list[int], S: int, T: int) -> tuple[list[list[int]], list[tuple[int, int, int]]]:
    """First fit by decreasing source length: each example joins the first row where its source (n) still fits in
    S and its target (m) in T. Returns the rows' [source, target] lengths and each example's (row, source offset,
    target offset)."""
    rows: list[list[int]] = []
    where = [(0, 0, 0)] * len(n)
    for i in sorted(range(len(n)), key=lambda i: -n[i]):
        for r, used in enumerate(rows):
            if used[0] + n[i] <= S and used[1] + m[i] <= T:
                break
        else:
            r, used = len(rows), [0, 0]
            rows.append(used)
        where[i] = (r, used[0], used[1])
        used[0] += n[i]
        used[1] += m[i]
    return rows, where


def pack(attention_mask: torch.Tensor, labels: torch.Tensor) -> Packing | None:
    """Pack a padded batch (source attention_mask (B, S), labels (B, T), IGNORE_INDEX at padding) into rows of
    sources no longer than S: first fit by decreasing source length (`_first_fit`), with targets held to T, 2T or
    no bound, whichever packs into the fewest positions (rows x (source + target length); never more than the
    padded batch's). Short targets of equal length (a class label) thus share rows too. None when the batch cannot
    be packed as it is: a source that is not one run of tokens from the row's start (left padding, holes) or is
    empty.

    A target runs to its last label that is not IGNORE_INDEX (ignored labels before it are kept: the decoder reads
    them); an example without any is kept with an empty target.

    The plan needs every example's lengths on the host: where both tensors have host copies (`attach_host`: the
    training loop's batches) it is made from those and its indices moved to the device (no device read); else
    from the tensors themselves (a device sync on an accelerator).
    """
    host_mask, host_labels = host_copy(attention_mask), host_copy(labels)
    if host_mask is not None and host_labels is not None:
        packing = _pack(host_mask, host_labels)
        return None if packing is None else packing.to(attention_mask.device)
    return _pack(attention_mask, labels)


def _pack(attention_mask: torch.Tensor, labels: torch.Tensor) -> Packing | None:
    """`pack` on the tensors as they are (their device's)."""
    B, S = attention_mask.shape
    T = labels.shape[1]
    device = attention_mask.device
    source = attention_mask.sum(1)  # (B,)
    if bool((source == 0).any()) or not bool(
            (attention_mask.bool() == (torch.arange(S, device=device)[None, :] < source[:, None])).all()):
        return None
    real = labels != IGNORE_INDEX
    target = torch.where(real.any(1), T - real.flip(1).int().argmax(1), 0)  # (B,) up to the last real label
    n, m = source.tolist(), target.tolist()

    def size(fit: tuple[list[list[int]], list]) -> int:
        return len(fit[0]) * (max(u[0] for u in fit[0]) + max(max(u[1] for u in fit[0]), 1))

    rows, where = min((_first_fit(n, m, S, cap) for cap in (T, 2 * T, sum(m))), key=size)
    S2, T2 = max(u[0] for u in rows), max(max(u[1] for u in rows), 1)
    row_of = [w[0] for w in where]
    source_to = _spans(n, row_of, [w[1] for w in where], S2, device)
    target_to = _spans(m, row_of, [w[2] for w in where], T2, device)
    examples = torch.arange(1, B + 1, device=device)
    source_segments = torch.zeros(len(rows) * S2, dtype=torch.long, device=device)
    source_segments[source_to] = torch.repeat_interleave(examples, source)
    target_segments = torch.zeros(len(rows) * T2, dtype=torch.long, device=device)
    target_segments[target_to] = torch.repeat_interleave(examples, target)
    return Packing(_spans(n, list(range(B)), [0] * B, S, device), source_to, source_segments.view(-1, S2),
                   _spans(m, list(range(B)), [0] * B, T, device), target_to, target_segments.view(-1, T2))


# ------------------------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------------------------
class T5PreTrainedModel(PreTrainedModel):
    """T5's initialisation; model-directory io (`from_pretrained`, `save_pretrained`) as every bertkit model."""

    config: T5Config
    config_class = T5Config  # what `from_pretrained` reads config.json as (a BERT-family directory is refused)
    encoder_prefix = ""  # transformers' T5 names have no model prefix: "shared.weight", "encoder.block.0...."

    def init_weights(self) -> None:
        """T5's initialisation: normal(0, factor * fan_in**-0.5) for every projection, with the query's also
        divided by sqrt(D) (the scaling the scores leave out), normal(0, factor) for the embeddings (and an
        untied output projection), the norms at `factor` (initializer_factor, 1.0 but in tests)."""
        c = self.config
        f, d = c.initializer_factor, c.d_model
        for module in self.modules():
            if isinstance(module, RMSNorm):
                nn.init.constant_(module.weight, f)
            elif isinstance(module, Attention):
                nn.init.normal_(module.query.weight, std=f * (d * c.d_kv) ** -0.5)
                nn.init.normal_(module.key.weight, std=f * d ** -0.5)
                nn.init.normal_(module.value.weight, std=f * d ** -0.5)
                nn.init.normal_(module.out.weight, std=f * c.inner_dim ** -0.5)
            elif isinstance(module, FeedForward):
                for projection in (module.up, module.gate, module.linear):
                    if projection is not None:
                        nn.init.normal_(projection.weight, std=f * d ** -0.5)
                nn.init.normal_(module.down.weight, std=f * c.d_ff ** -0.5)
            elif isinstance(module, Stack):
                nn.init.normal_(module.position_bias.weight, std=f * d ** -0.5)
        nn.init.normal_(self.shared.weight, std=f)
        if getattr(self, "lm_head", None) is not None:
            nn.init.normal_(self.lm_head.weight, std=f)

    def _check(self, ids: torch.Tensor, mask: torch.Tensor | None, name: str) -> None:
        """Refuse ids the model cannot embed and masks of another shape, naming the tensor."""
        check_ids(ids, name, "(batch, length)")
        if mask is not None and mask.shape != ids.shape:
            raise ValueError(f"the attention mask of {name} has shape {tuple(mask.shape)} but {name} has "
                             f"{tuple(ids.shape)}")
        check_ids_in_vocabulary(ids, self.config.vocab_size, name)


class T5EncoderModel(T5PreTrainedModel):
    """T5's encoder alone: token ids -> contextual vectors (transformers' T5EncoderModel). It loads from an
    encoder-decoder directory too, leaving the decoder out."""

    architecture = "T5EncoderModel"

    def __init__(self, config: T5Config) -> None:
        super().__init__()
        # An encoder alone is not an encoder-decoder; its config.json says so, as transformers writes it.
        self.config = config = dataclasses.replace(config, is_encoder_decoder=False)
        self.shared = nn.Embedding(config.vocab_size, config.d_model)
        self.encoder = Stack(config, decoder=False)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                output_hidden_states: bool = False) -> T5EncoderOutput:
        """input_ids: (B, S); attention_mask: (B, S) 1 = token, 0 = padding (either side: positions are relative)."""
        self._check(input_ids, attention_mask, "input_ids")
        hidden, states = self.encoder(self.shared(input_ids), attention_mask,
                                      output_hidden_states=output_hidden_states)
        return T5EncoderOutput(hidden, states)


class T5ForConditionalGeneration(T5PreTrainedModel):
    """The encoder-decoder with its output projection: source ids -> scores for every next target token, and
    `generate` (greedy, sampling, beam search) with a key/value cache."""

    architecture = "T5ForConditionalGeneration"
    head_family = "seq2seq"  # bertkit.checkpoint's T5 table: the decoder and the output projection
    requires_pretrained_heads = True  # a directory without a decoder cannot make this model

    def __init__(self, config: T5Config) -> None:
        if not config.is_encoder_decoder:
            raise ValueError("T5Config.is_encoder_decoder is false (an encoder alone: T5EncoderModel); "
                             "T5ForConditionalGeneration needs an encoder-decoder config")
        super().__init__()
        self.config = config
        self.shared = nn.Embedding(config.vocab_size, config.d_model)
        self.encoder = Stack(config, decoder=False)
        self.decoder = Stack(config, decoder=True)
        # Tied (T5 1.0): the output projection is the shared matrix itself, so there is no module to hold.
        self.lm_head = None if config.tie_word_embeddings else Linear(config.d_model, config.vocab_size, bias=False)
        self.init_weights()

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, S) source ids and padding mask -> the encoder output (B, S, d)."""
        self._check(input_ids, attention_mask, "input_ids")
        return self.encoder(self.shared(input_ids), attention_mask)[0]

    def decode(self, decoder_input_ids: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor | None = None,
               decoder_attention_mask: torch.Tensor | None = None,
               cache: DecoderCache | None = None) -> torch.Tensor:
        """Decoder input ids (B, T) over the encoder output memory (B, S, d) -> logits (B, T, V).

        With a cache, decoder_input_ids are the new positions only (one per generation step) and a
        decoder_attention_mask covers the cached positions too: (B, past + T).
        """
        h, _ = self.decoder(self.shared(decoder_input_ids), decoder_attention_mask, memory, memory_mask, cache)
        return self.project(h)

    def project(self, h: torch.Tensor) -> torch.Tensor:
        """Decoder outputs (..., d) -> logits (..., V)."""
        if self.config.scale_output:  # tied: bring the output back to the embeddings' scale first
            h = h * self.config.d_model ** -0.5
        return self.lm_head(h) if self.lm_head is not None else linear(h, self.shared.weight)

    def shift_right(self, labels: torch.Tensor) -> torch.Tensor:
        """(B, T) labels -> the decoder's inputs: decoder_start_token_id, then the labels but the last, with
        IGNORE_INDEX turned into padding (the decoder reads ids, the loss skips those positions anyway)."""
        shifted = labels.new_full(labels.shape, self.config.decoder_start_token_id)
        shifted[:, 1:] = labels[:, :-1]
        return shifted.masked_fill(shifted == IGNORE_INDEX, self.config.pad_token_id)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                decoder_input_ids: torch.Tensor | None = None, decoder_attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, at_labels: bool = False) -> Seq2SeqOutput:
        """input_ids, attention_mask: (B, S) the source and its padding mask (1 = token).

        labels: (B, T) the target ids ending with EOS, IGNORE_INDEX where no loss is taken (padding); the decoder
        reads them shifted right (`shift_right`) unless decoder_input_ids (B, T) are given. decoder_attention_mask:
        an optional (B, T) padding mask of the decoder inputs (the causal mask always applies).

        at_labels (training: labels, neither decoder_input_ids nor decoder_attention_mask): logits (N, V) only at
        the N labels that are not IGNORE_INDEX, in row-major order, the only ones a loss reads; the output
        projection skips the others, and with the `unpad` fast path the batch runs packed (`pack`), skipping the
        padding everywhere. loss is None (the caller reduces the logits as its objective wants: with labels[labels !=
        IGNORE_INDEX] they give the mean loss); encoder_last_hidden_state is the packed rows' when packed.
        """
        if at_labels:
            if labels is None or decoder_input_ids is not None or decoder_attention_mask is not None:
                raise ValueError("at_labels takes labels and neither decoder_input_ids nor decoder_attention_mask")
            return self._forward_at_labels(input_ids, attention_mask, labels)
        if decoder_input_ids is None:
            if labels is None:
                raise ValueError("T5ForConditionalGeneration needs decoder_input_ids or labels")
            decoder_input_ids = self.shift_right(labels)
        self._check(decoder_input_ids, decoder_attention_mask, "decoder_input_ids")
        memory = self.encode(input_ids, attention_mask)
        logits = self.decode(decoder_input_ids, memory, attention_mask, decoder_attention_mask)
        return Seq2SeqOutput(token_loss(logits, labels), logits, memory)

    def _forward_at_labels(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                           labels: torch.Tensor) -> Seq2SeqOutput:
        """`forward(..., at_labels=True)`: packed when the fast path is on and the batch packs, else padded."""
        decoder_input_ids = self.shift_right(labels)
        self._check(input_ids, attention_mask, "input_ids")
        self._check(decoder_input_ids, None, "decoder_input_ids")
        # (N,) the labelled positions, from the labels' host copy where they have one (no device read)
        at = positions(mark_host(labels != IGNORE_INDEX, labels, _labelled))
        packing = None
        if self.encoder.unpad and self.decoder.unpad:
            packing = pack(attention_mask if attention_mask is not None else torch.ones_like(input_ids), labels)
        if packing is None:
            memory = self.encoder(self.shared(input_ids), attention_mask)[0]
            hidden = self.decoder(self.shared(decoder_input_ids), None, memory, attention_mask)[0]
            hidden = hidden.flatten(0, 1).index_select(0, at)  # (N, d)
        else:
            segments = packing.source_segments
            sources, targets = packing.gather(input_ids, True), packing.gather(decoder_input_ids, False)
            # One lookup for both stacks: one dense gradient of the (V, d) matrix to fill and add, not two.
            embedded = self.shared(torch.cat([sources.reshape(-1), targets.reshape(-1)]))
            sources, targets = embedded[:sources.numel()], embedded[sources.numel():]
            memory = self.encoder(sources.view(*segments.shape, -1), segments=segments)[0]  # (R, S', d)
            out = self.decoder(targets.view(*packing.target_segments.shape, -1), memory=memory,
                               segments=packing.target_segments, memory_segments=segments)[0]  # (R, T', d)
            packed_at = torch.full((labels.numel(),), -1, dtype=torch.long, device=labels.device)
            packed_at[packing.target_from] = packing.target_to
            hidden = out.reshape(-1, out.shape[-1]).index_select(0, packed_at.index_select(0, at))  # (N, d)
        return Seq2SeqOutput(None, self.project(hidden), memory)  # logits (N, V)

    # ---- generation ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, max_new_tokens: int = 20,
                 num_beams: int = 1, temperature: float = 0.0, top_k: int | None = None,
                 generator: torch.Generator | None = None, length_penalty: float = 1.0,
                 early_stopping: bool = True) -> torch.Tensor:
        """Write up to `max_new_tokens` target tokens for each source row (B, S) (padded, with its attention_mask).

        Returns (B, 1 + n): decoder_start_token_id, then the tokens; a row that produced EOS is padded with
        pad_token_id up to the longest row. num_beams 1: greedy (temperature 0, the argmax) or sampling from
        softmax(logits / temperature), among the `top_k` best when given, drawn with `generator`. num_beams > 1:
        beam search with `length_penalty` (hypotheses are ranked by summed log-probability / generated
        length ** length_penalty) and `early_stopping` (an input is done once it has num_beams hypotheses), the
        same tokens as transformers' generate(num_beams=..., do_sample=False) on the same weights.
        """
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
        if not isinstance(num_beams, int) or num_beams < 1:
            raise ValueError(f"num_beams must be a positive integer, got {num_beams!r}")
        if num_beams > 1 and temperature > 0:
            raise ValueError("beam search is deterministic here: give num_beams > 1 or temperature > 0, not both")
        if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
            raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")
        was_training = self.training
        self.eval()
        try:
            memory = self.encode(input_ids, attention_mask)  # (B, S, d), once for every step
            if num_beams > 1:
                return self._beam_search(memory, attention_mask, max_new_tokens, num_beams, length_penalty,
                                         early_stopping)
            return self._greedy_or_sample(memory, attention_mask, max_new_tokens, temperature, top_k, generator)
        finally:
            self.train(was_training)

    def _greedy_or_sample(self, memory: torch.Tensor, mask: torch.Tensor | None, max_new_tokens: int,
                          temperature: float, top_k: int | None, generator: torch.Generator | None) -> torch.Tensor:
        """One token per row and step, the argmax or a sample; stops when every row has produced EOS."""
        c = self.config
        B = memory.shape[0]
        ids = torch.full((B, 1), c.decoder_start_token_id, dtype=torch.long, device=memory.device)
        ended = torch.zeros(B, dtype=torch.bool, device=memory.device)
        cache = DecoderCache(len(self.decoder.layers))
        for _ in range(max_new_tokens):
            logits = self.decode(ids[:, -1:], memory, mask, cache=cache)[:, -1].float()  # (B, V), the new position
            if temperature <= 0:
                token = logits.argmax(-1)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]  # (B, 1)
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                token = torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(1)
            token = token.masked_fill(ended, c.pad_token_id)  # a row that ended only pads
            ids = torch.cat([ids, token[:, None]], dim=1)
            ended |= token == c.eos_token_id
            if bool(ended.all()):
                break
        return ids

    def _beam_search(self, memory: torch.Tensor, mask: torch.Tensor | None, max_new_tokens: int, K: int,
                     length_penalty: float, early_stopping: bool) -> torch.Tensor:
        """Beam search by transformers' rules, step for step, so that equal weights give equal beams.

        Each step extends the K running beams of an input by every token and keeps the 2K best continuations by
        summed log-probability. The K best of them that do not end (EOS, or the length limit) run on; those among
        the first K that end become hypotheses, scored sum / generated_length ** length_penalty, and each input
        keeps its K best hypotheses. An input is done when it holds K hypotheses (early_stopping) or when no
        running beam, scored at the current length, beats its worst hypothesis. Scores of what must not be chosen
        get -1e9 added, as transformers does, so ties break alike.
        """
        c = self.config
        B, V, device = memory.shape[0], c.vocab_size, memory.device
        memory = memory.repeat_interleave(K, dim=0)  # (B*K, S, d): the K beams of input b are rows bK .. bK+K-1
        mask = mask.repeat_interleave(K, dim=0) if mask is not None else None
        length = 1 + max_new_tokens  # the longest sequence: start token + generated tokens
        running = torch.full((B, K, length), c.pad_token_id, dtype=torch.long, device=device)
        running[:, :, 0] = c.decoder_start_token_id
        running_scores = torch.zeros(B, K, device=device)
        running_scores[:, 1:] = -1e9  # the K beams start equal: only the first one may expand at the first step
        hyps, hyp_scores = running.clone(), torch.full((B, K), -1e9, device=device)  # each input's K hypotheses
        hyp_lengths = torch.ones(B, K, dtype=torch.long, device=device)
        hyp_real = torch.zeros(B, K, dtype=torch.bool, device=device)  # which hypothesis slots hold one
        improvable = torch.ones(B, 1, dtype=torch.bool, device=device)
        first_k = torch.arange(2 * K, device=device) < K  # (2K,) candidates that may become hypotheses
        row0 = torch.arange(B, device=device)[:, None] * K  # (B, 1) row of each input's first beam
        cache = DecoderCache(len(self.decoder.layers))
        for step in range(1, length):  # step = tokens in every running beam, the start token included
            logits = self.decode(running[:, :, step - 1].reshape(B * K, 1), memory, mask, cache=cache)[:, -1]
            scores = F.log_softmax(logits.float(), dim=-1).view(B, K, V) + running_scores[:, :, None]
            top_scores, top = scores.view(B, K * V).topk(2 * K)  # (B, 2K) over every beam's every continuation
            beam, token = top // V, top % V
            candidates = torch.take_along_dim(running, beam[:, :, None], dim=1)  # (B, 2K, length)
            candidates[:, :, step] = token
            ends = (token == c.eos_token_id) | (step + 1 >= length)  # (B, 2K)
            # The K best continuations that go on.
            going = top_scores + ends.float() * -1e9
            keep = going.topk(K).indices  # (B, K)
            running = torch.take_along_dim(candidates, keep[:, :, None], dim=1)
            running_scores = torch.take_along_dim(going, keep, dim=1)
            rows = (torch.take_along_dim(beam, keep, dim=1) + row0).reshape(-1)  # (B*K,) their parents' rows
            # Candidates among the first K that end: hypotheses, unless the input is done (full, or no improvement).
            ended = ends & first_k
            full = hyp_real.all(dim=1, keepdim=True) & early_stopping
            new_scores = top_scores / (step ** length_penalty)
            new_scores = new_scores + full * -1e9 + (~improvable) * -1e9 + (~ended) * -1e9
            best = torch.cat([hyp_scores, new_scores], dim=1).topk(K).indices  # (B, K) of K + 2K
            hyps = torch.take_along_dim(torch.cat([hyps, candidates], dim=1), best[:, :, None], dim=1)
            hyp_scores = torch.take_along_dim(torch.cat([hyp_scores, new_scores], dim=1), best, dim=1)
            hyp_lengths = torch.take_along_dim(torch.cat([hyp_lengths, torch.full_like(top, step + 1)], dim=1),
                                               best, dim=1)
            hyp_real = torch.take_along_dim(torch.cat([hyp_real, ended], dim=1), best, dim=1)
            cache.reorder(rows)
            # Could the best running beam, scored at the current length, still beat the worst hypothesis?
            worst = torch.where(hyp_real, hyp_scores.min(dim=1, keepdim=True).values, -1e9)  # (B, K)
            improvable = improvable & (running_scores[:, :1] / (step ** length_penalty) > worst).any(1, keepdim=True)
            if not bool(improvable.any()) or (early_stopping and bool(hyp_real.all())) or bool(ends.all()):
                break
        return hyps[:, 0, :int(hyp_lengths[:, 0].max())]  # the best hypothesis of each input (sorted by topk)
