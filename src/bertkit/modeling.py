"""The BERT family's model: embeddings -> encoder layers -> pooler, and the pretraining heads.

Read it top to bottom: small helpers, the embedding block, self-attention, the feed-forward block, one encoder
layer, the pooler and the heads, then the models. Shapes use B = batch, T = sequence length, H = hidden size,
E = embedding width (H unless factorised), A = attention heads, D = H / A (head size), V = vocabulary size.

One implementation serves the whole family; the variants are fields of `BertConfig`, read where they act:

    RoBERTa   padding_offset_positions   Embeddings: positions count from pad_token_id + 1, skipping padding
    ALBERT    embedding_size             Embeddings E wide, then BertModel.project (E -> H); MLM head back to E
              num_hidden_groups          BertModel runs L layers over fewer weight sets (cross-layer sharing)
    ELECTRA   embedding_size             as ALBERT; BertForReplacedTokenDetection + a small BertForMaskedLM
    GPT-style causal                     the attention mask hides later tokens (BertForCausalLM, `generate`)
    DistilBERT type_vocab_size = 0       no token-type embedding

Speed without changing the architecture (each a switch, `set_fast_paths` / `compile_layers`, pinned to the plain
path by tests/test_fastpaths.py):

    unpadding      a batch with padding runs on its real tokens only (`Unpadded`: a flat (N, H) tensor; attention
                   per sequence), so no layer computes on padding; the heads pick the positions they need
    packed rows    an attention mask numbering documents 1, 2, ... keeps attention within each document and
                   restarts its positions, so several short documents share a row without seeing each other
    fused QKV      one (3H, H) projection instead of three (model directories keep transformers' three tensors)
    oneDNN         `linear`: float32 CPU matmuls on oneDNN's kernels, twice MKL's speed where MKL runs its AVX2
                   code on an AVX-512 CPU (forward and backward)
    sparse MLM     `predict_at`: the vocabulary projection only at the masked positions
    compile        `compile_layers`: torch.compile of the encoder layer, with an eager fallback

Inside, modules carry short names of our own (`attn.qkv`, `ffn.up`, ...). On disk a model directory uses
transformers' parameter names of its family; the mapping is a table per family in `bertkit.checkpoint`, so a
checkpoint written here loads in transformers and the other way round.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.config import BertConfig

IGNORE_INDEX = -100  # label value that the losses skip (unmasked positions, padding)


# ------------------------------------------------------------------------------------------------------------------
# Outputs
# ------------------------------------------------------------------------------------------------------------------
@dataclass
class BertOutput:
    """What `BertModel.forward` returns."""

    last_hidden_state: torch.Tensor  # (B, T, H) output of the last layer
    pooler_output: torch.Tensor | None  # (B, H) tanh(dense([CLS])), None without a pooler
    hidden_states: tuple[torch.Tensor, ...] | None = None  # L+1 tensors (B, T, H): embeddings (projected), every layer
    attentions: tuple[torch.Tensor, ...] | None = None  # L tensors (B, A, T, T): attention probabilities


@dataclass
class PreTrainingOutput:
    """What `BertForPreTraining.forward` returns; losses are None when their labels are not given."""

    loss: torch.Tensor | None  # mlm_loss + nsp_loss (those of them that were computed)
    prediction_logits: torch.Tensor  # (B, T, V) MLM scores
    seq_relationship_logits: torch.Tensor | None  # (B, 2) NSP/SOP scores: 0 = IsNext / in order; None without a head
    mlm_loss: torch.Tensor | None = None
    nsp_loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class TaskOutput:
    """What a task model (and the LM and discriminator models) returns; `loss` is None without labels."""

    loss: torch.Tensor | None
    logits: torch.Tensor  # (B, num_labels), (B, T, num_labels), (B, num_choices); QA: (B, T, 2) start/end
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None

    @property
    def start_logits(self) -> torch.Tensor:  # question answering
        return self.logits[..., 0]

    @property
    def end_logits(self) -> torch.Tensor:
        return self.logits[..., 1]


# ------------------------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------------------------
def activation(name: str):
    """The activation function called `name` in transformers' configs."""
    if name == "gelu":
        return F.gelu  # exact, erf-based: what BERT was trained with
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu
    if name in ("silu", "swish"):
        return F.silu
    raise ValueError(f"unknown activation {name!r}")


# oneDNN's float32 matmul kernels: on CPUs where torch's default BLAS (MKL) takes a slower code path (AVX-512 CPUs
# not made by Intel run MKL's AVX2 kernels) they are about twice as fast, with float32 rounding alike.
ONEDNN_MIN_MACS = 1 << 22  # below this many multiply-adds a call's fixed cost outweighs the faster kernel


def _onednn_mm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., K) @ weight (N, K)^T + bias (N) on oneDNN; strided views are read as they are, without a copy."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _onednn_works() -> bool:
    """Whether this torch build has the oneDNN linear kernel and it computes a known product (the operator is
    torch's internal one, so a build without it, or with another signature, falls back to F.linear)."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    try:
        product = _onednn_mm(torch.ones(2, 3), torch.ones(4, 3), torch.zeros(4))
    except (RuntimeError, TypeError, NotImplementedError):
        return False
    return torch.equal(product, torch.full((2, 4), 3.0))


_ONEDNN = _onednn_works()


class OneDNNLinear(torch.autograd.Function):
    """F.linear with all three matmuls (the output and both gradients) on oneDNN's float32 kernels."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _onednn_mm(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad_x = grad_weight = grad_bias = None
        rows = grad.reshape(-1, grad.shape[-1])  # (M, N)
        if ctx.needs_input_grad[0]:
            grad_x = _onednn_mm(grad, weight.t())  # (..., N) @ (N, K)
        if ctx.needs_input_grad[1]:
            grad_weight = _onednn_mm(rows.t(), x.reshape(-1, x.shape[-1]).t())  # (N, M) @ (M, K)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = rows.sum(0)
        return grad_x, grad_weight, grad_bias


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           onednn: bool = True) -> torch.Tensor:
    """F.linear(x, weight, bias), on oneDNN (`OneDNNLinear`) for float32 on the CPU outside autocast and
    torch.compile (which lowers its own matmuls) when the product is large enough; `onednn=False` is the plain
    path. Same numbers within float32 rounding (tests/test_fastpaths.py)."""
    if (onednn and _ONEDNN and x.device.type == "cpu" and x.dtype == torch.float32
            and weight.dtype == torch.float32 and x.numel() * weight.shape[0] >= ONEDNN_MIN_MACS
            and not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling()):
        return OneDNNLinear.apply(x, weight, bias)
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """nn.Linear computed by `linear`: the `onednn` switch (`set_fast_paths`) picks oneDNN's kernels."""

    onednn = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.onednn)


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


def position_ids(input_ids: torch.Tensor, config: BertConfig,
                 documents: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T) ids -> positions: 0..T-1 (BERT), or RoBERTa's padding-offset positions.

    RoBERTa (fairseq) numbers the real tokens pad_token_id + 1, pad_token_id + 2, ... and gives every padding
    token the position pad_token_id, as transformers' `create_position_ids_from_input_ids` does.
    documents: a packed attention mask (B, T), document numbers 1, 2, ... (0 = padding); positions then restart
    at the first token of every document, so each document is embedded as if it were alone in its row.
    """
    B, T = input_ids.shape
    if documents is not None:
        t = torch.arange(T, device=input_ids.device).expand(B, T)
        starts = torch.ones_like(documents, dtype=torch.bool)
        starts[:, 1:] = documents[:, 1:] != documents[:, :-1]
        pos = t - torch.where(starts, t, 0).cummax(dim=1).values  # (B, T): distance to the document's start
        if not config.padding_offset_positions:
            return pos
        real = documents.ne(0)
        return torch.where(real, pos + config.pad_token_id + 1, config.pad_token_id)
    if not config.padding_offset_positions:
        return torch.arange(T, device=input_ids.device)  # (T,), broadcast over the batch
    real = input_ids.ne(config.pad_token_id).long()  # (B, T)
    return torch.cumsum(real, dim=1) * real + config.pad_token_id


# ------------------------------------------------------------------------------------------------------------------
# Layouts: where the tokens sit while the layers run
# ------------------------------------------------------------------------------------------------------------------
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


class Unpadded:
    """The fast layout: the real tokens of a padded (B, T) batch as one flat (N, H) tensor, grouped by sequence.

    A *sequence* is a row's real tokens, or, for a packed row (attention mask numbering its documents 1, 2, ...),
    one document. Linear layers, LayerNorm, activations and dropout then never touch padding. Attention runs per
    sequence: FlashAttention's variable-length kernel on GPU when the `flash_attn` package is installed (bf16/fp16);
    otherwise the sequences, sorted by length, are cut into up to `groups` groups, each laid out as (S_g, L_g, H)
    with L_g its own longest sequence, and PyTorch's SDPA runs on each with a key-padding mask, so attention
    costs about the sum of the squared lengths, not S x T^2. Either way no token attends across sequences or to
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
        """qkv: (N, 3H) queries, keys and values side by side -> context (N, H)."""
        N, H = qkv.shape[0], qkv.shape[1] // 3
        if flash_attn_varlen is not None and use_flash_attn(qkv):
            q, k, v = qkv.view(N, 3, num_heads, H // num_heads).unbind(1)  # (N, A, D) each
            context = flash_attn_varlen(q, k, v, self.cu_seqlens, self.cu_seqlens, self.max_len, self.max_len,
                                        dropout_p=dropout, causal=self.causal)
            return context.reshape(N, H)
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


try:  # optional: FlashAttention-2's variable-length kernel (CUDA, fp16/bf16); never required
    from flash_attn import flash_attn_varlen_func as flash_attn_varlen
except ImportError:  # the usual case, and always on CPU
    flash_attn_varlen = None


def use_flash_attn(q: torch.Tensor) -> bool:
    """Whether FlashAttention's kernel can take these activations (when the package is installed)."""
    return q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)


# ------------------------------------------------------------------------------------------------------------------
# Blocks
# ------------------------------------------------------------------------------------------------------------------
class Embeddings(nn.Module):
    """word + position + token-type embeddings, then LayerNorm and dropout; E wide (= H unless factorised)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        E = config.embedding_width
        self.config = config
        self.word = nn.Embedding(config.vocab_size, E)
        self.position = nn.Embedding(config.max_position_embeddings, E)
        # DistilBERT has no segments: type_vocab_size 0 means no table, and token_type_ids are ignored.
        self.token_type = nn.Embedding(config.type_vocab_size, E) if config.type_vocab_size else None
        self.norm = nn.LayerNorm(E, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Ids, token types and positions of the same shape, (B, T) or flat (N,) -> (..., E)."""
        x = self.word(input_ids)
        if self.token_type is not None:
            x = x + self.token_type(token_type_ids)
        x = x + self.position(positions)  # the order transformers sums in, bit for bit
        return self.dropout(self.norm(x))


class SelfAttention(nn.Module):
    """Multi-head self-attention with its output projection, residual and LayerNorm (post-LN, as in BERT).

    The query, key and value projections are one (3H, H) weight, `qkv`: one matmul instead of three
    (`fused_qkv`; False runs the three products on its row blocks, the plain path). Model directories keep
    transformers' three tensors: the state-dict hooks below split and join them.
    """

    fused_qkv = True

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        H = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.qkv = Linear(H, 3 * H)  # rows: query, key, value
        self.out = Linear(H, H)
        self.norm = nn.LayerNorm(H, eps=config.layer_norm_eps)
        self.attn_dropout = config.attention_probs_dropout_prob
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.register_state_dict_post_hook(_split_qkv)
        self.register_load_state_dict_pre_hook(_join_qkv)

    def forward(self, x: torch.Tensor, layout: Padded | Unpadded,
                return_probs: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, T, H) in the padded layout, (N, H) unpadded. Returns the new x and, when asked (padded layout
        only), the (B, A, T, T) attention probabilities."""
        H = x.shape[-1]
        if self.fused_qkv:
            qkv = self.qkv(x)  # (..., 3H)
        else:  # the plain path: three products, on the weight's row blocks
            w, b = self.qkv.weight, self.qkv.bias
            qkv = torch.cat([F.linear(x, w[i * H:(i + 1) * H], b[i * H:(i + 1) * H]) for i in range(3)], dim=-1)
        dropout = self.attn_dropout if self.training else 0.0
        probs = None
        if return_probs:
            context, probs = layout.probabilities(qkv, self.num_heads, dropout, self.training)
        else:
            context = layout.attend(qkv, self.num_heads, dropout)
        return self.norm(x + self.dropout(self.out(context))), probs


_QKV = ("query", "key", "value")


def _split_qkv(module: SelfAttention, state: dict, prefix: str, local_metadata) -> None:
    """state_dict: `qkv.weight/bias` -> transformers' `query`, `key`, `value` tensors (views, no copy)."""
    for kind in ("weight", "bias"):
        fused = state.pop(f"{prefix}qkv.{kind}")
        for name, part in zip(_QKV, fused.chunk(3, dim=0)):
            state[f"{prefix}{name}.{kind}"] = part


def _join_qkv(module: SelfAttention, state: dict, prefix: str, local_metadata, strict, missing_keys,
              unexpected_keys, error_msgs) -> None:
    """load_state_dict: `query`, `key`, `value` tensors -> one `qkv` tensor (those absent stay missing)."""
    for kind in ("weight", "bias"):
        names = [f"{prefix}{name}.{kind}" for name in _QKV]
        if all(n in state for n in names):
            state[f"{prefix}qkv.{kind}"] = torch.cat([state.pop(n) for n in names], dim=0)


class FeedForward(nn.Module):
    """H -> intermediate -> H with the configured activation, residual and LayerNorm."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.up = Linear(config.hidden_size, config.intermediate_size)
        self.down = Linear(config.intermediate_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.dropout(self.down(self.act(self.up(x)))))


class Layer(nn.Module):
    """One encoder layer: self-attention block, then feed-forward block."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attn = SelfAttention(config)
        self.ffn = FeedForward(config)

    def forward(self, x: torch.Tensor, layout: Padded | Unpadded,
                return_probs: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        x, probs = self.attn(x, layout, return_probs)
        return self.ffn(x), probs


class Pooler(nn.Module):
    """tanh(dense(h_[CLS])): the sentence vector the NSP/SOP head and sequence classifiers read."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = Linear(config.hidden_size, config.hidden_size)

    def forward(self, cls: torch.Tensor) -> torch.Tensor:
        """cls: (B, H) the last layer's vector at each row's first position."""
        return torch.tanh(self.dense(cls))


class MaskedLMHead(nn.Module):
    """dense (H -> E) + activation + LayerNorm, then scores over the vocabulary with the word embeddings (tied).

    With factorised embeddings (ALBERT, ELECTRA's generator) the transform lands in the E-wide embedding space, so
    the decoder can be the E-wide embedding matrix itself.
    """

    onednn = True  # the decoder's matmul on oneDNN where it applies (`linear`)

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding) -> None:
        super().__init__()
        E = config.embedding_width
        self.dense = Linear(config.hidden_size, E)
        self.act = activation(config.mlm_head_act)
        self.norm = nn.LayerNorm(E, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.word_embeddings = word_embeddings  # shared module, not a copy: the decoder is tied to it

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.act(self.dense(hidden)))  # (..., E)
        return linear(h, self.word_embeddings.weight, self.bias, self.onednn)  # (..., V)


class TokenDetectionHead(nn.Module):
    """ELECTRA's discriminator head: dense + activation + dense to one score per token (> 0: "replaced")."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.out = Linear(config.hidden_size, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.dense(hidden))).squeeze(-1)  # (B, T, H) -> (B, T)


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
        if self.tokens is None:
            return self.hidden[where]
        rows = self.tokens.rows(where.reshape(-1).nonzero().squeeze(1))
        if rows.numel() and not rows.is_cuda and int(rows.min()) < 0:
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


# ------------------------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------------------------
class PreTrainedModel(nn.Module):
    """Initialisation and model-directory io shared by every bertkit model."""

    config: BertConfig
    architecture = "BertModel"  # the transformers class name (BERT's; checkpoint.py renames it per family)
    head_family: str | None = None  # which head table of bertkit.checkpoint names this model's head
    encoder_prefix = "bert."  # where the encoder sits in this model's parameter names
    requires_pretrained_heads = False  # refuse a checkpoint without this model's head (instead of starting fresh)

    @classmethod
    def kwargs_from_config(cls, raw: dict) -> dict:
        """Constructor arguments a model directory's config.json implies (e.g. the number of labels)."""
        return {}

    def config_extras(self) -> dict:
        """Keys besides BertConfig's that config.json needs for transformers to build this model."""
        return {}

    def init_weights(self) -> None:
        """BERT initialisation: normal(0, initializer_range) weights, zero biases, LayerNorm weight 1 / bias 0."""
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, MaskedLMHead):
                nn.init.zeros_(module.bias)

    def num_parameters(self) -> int:
        """Distinct parameters (tied and shared weights counted once)."""
        return sum(p.numel() for p in self.parameters())

    @classmethod
    def from_pretrained(cls, directory: str | Path, **kwargs):
        """Load a model directory (bertkit's or transformers'): config.json + model.safetensors/pytorch_model.bin."""
        from bertkit.checkpoint import load_model

        return load_model(cls, directory, **kwargs)

    def save_pretrained(self, directory: str | Path, tokenizer=None) -> None:
        """Write config.json + model.safetensors (transformers' names), and the tokenizer files when given."""
        from bertkit.checkpoint import save_model

        save_model(self, directory, tokenizer=tokenizer)


class BertModel(PreTrainedModel):
    """The encoder: token ids -> contextual vectors (and the pooled [CLS] vector)."""

    architecture = "BertModel"
    encoder_prefix = ""
    unpad = True  # run on the real tokens only when a batch has padding (False: the plain padded path)

    def __init__(self, config: BertConfig, add_pooler: bool = True) -> None:
        """add_pooler: build the pooler (families without one, ELECTRA and DistilBERT, never have it)."""
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        # Factorised embeddings: E-wide vectors enter the layers through one learned E -> H map.
        self.project = Linear(config.embedding_size, config.hidden_size) if config.embedding_size else None
        # With sharing (ALBERT) there are fewer weight sets than layers; forward applies them in turn.
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.num_layer_weights))
        self.pooler = Pooler(config) if add_pooler and config.family.pooler else None
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False) -> BertOutput:
        """input_ids, token_type_ids: (B, T) integer tensors; attention_mask (B, T): 1 = real token, 0 = padding,
        or, for packed rows, the document number 1, 2, ... of each token (attention stays within a document and
        positions restart at each document's first token).

        With the unpadded layout (the default) `last_hidden_state` and `hidden_states` are 0 at padding positions;
        the real positions are what transformers computes.
        """
        out = self.encode(input_ids, attention_mask, token_type_ids, output_hidden_states, output_attentions)
        pooled = self.pooler(out.first()) if self.pooler is not None else None
        return BertOutput(out.padded(), pooled, out.hidden_states, out.attentions)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None, output_hidden_states: bool = False,
               output_attentions: bool = False) -> Encoded:
        """The encoder's output in the layout it ran in (see `Encoded`); `forward` pads it back to (B, T, H).

        The layout: without padding, (B, T, H) and attention without a mask; with padding or packed rows, the
        real tokens only (`Unpadded`) when `self.unpad` (the default), else (B, T, H) with an additive mask, the
        plain path, which `output_attentions` also needs.
        """
        check_inputs(self.config, input_ids, attention_mask, token_type_ids)
        B, T = input_ids.shape
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        packed = full = False
        if attention_mask is not None and attention_mask.numel():
            low, high = (int(v) for v in attention_mask.aminmax())  # one device sync per forward
            packed, full = high > 1, low >= 1 and high == 1
        positions = position_ids(input_ids, self.config, attention_mask if packed else None)
        causal = self.config.causal
        tokens = None
        if attention_mask is None or (full and self.unpad and not output_attentions):
            layout: Padded | Unpadded = Padded(None, causal)  # no padding: nothing to mask but the future
            x = self.embeddings(input_ids, token_type_ids, positions)  # (B, T, E)
        elif self.unpad and not output_attentions:
            layout = tokens = Unpadded(attention_mask, packed, causal)
            x = self.embeddings(tokens.gather(input_ids), tokens.gather(token_type_ids), tokens.gather(positions))
        else:
            layout = Padded(attention_bias(attention_mask, causal, T, self.dtype, input_ids.device, packed))
            x = self.embeddings(input_ids, token_type_ids, positions)
        if self.project is not None:
            x = self.project(x)  # (..., H)
        hidden_states = [x] if output_hidden_states else None
        attentions = [] if output_attentions else None
        for i in range(self.config.num_hidden_layers):
            x, probs = self.layers[self.config.layer_weights_index(i)](x, layout, output_attentions)
            if hidden_states is not None:
                hidden_states.append(x)
            if attentions is not None:
                attentions.append(probs)
        if hidden_states is not None and tokens is not None:
            hidden_states = [tokens.pad(h) for h in hidden_states]
        return Encoded(x, tokens, tuple(hidden_states) if hidden_states else None,
                       tuple(attentions) if attentions is not None else None)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype masks are built in: that of the parameters (autocast keeps them float32)."""
        return self.embeddings.word.weight.dtype


class BertForPreTraining(PreTrainedModel):
    """The family's pretraining model: the masked-LM head, plus the sentence-pair head where the family has one.

    BERT: MLM + NSP; ALBERT: MLM + SOP (the same two-way head on the pooled output); RoBERTa, ELECTRA's generator
    and DistilBERT: MLM only (transformers' *ForMaskedLM).
    """

    architecture = "BertForPreTraining"
    head_family = "pretraining"
    requires_pretrained_heads = True
    with_pair_head = True  # BertForMaskedLM turns the pair head off whatever the family

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        pair = config.pair_head and self.with_pair_head
        self.bert = BertModel(config, add_pooler=pair)
        self.mlm = MaskedLMHead(config, self.bert.embeddings.word)
        self.nsp = Linear(config.hidden_size, 2) if pair else None
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                next_sentence_label: torch.Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False, predict_at: torch.Tensor | None = None) -> PreTrainingOutput:
        """labels: (B, T) original ids at masked positions, IGNORE_INDEX elsewhere; next_sentence_label: (B,).

        predict_at: optional (B, T) bool; the vocabulary projection then runs only at those positions (the masked
        ones, ~15% of tokens) and `prediction_logits` is (N, V) for the N selected positions in row-major order.
        The loss is the same as the dense one when predict_at covers every labelled position.
        """
        if next_sentence_label is not None and self.nsp is None:
            raise ValueError(f"{type(self).__name__} of a {self.config.model_type} model has no sentence-pair head")
        out = self.bert.encode(input_ids, attention_mask, token_type_ids, output_hidden_states, output_attentions)
        if predict_at is not None:
            hidden = out.select(predict_at)  # (N, H)
            if labels is not None:
                labels = labels[predict_at]
        else:
            hidden = out.padded()
        logits = self.mlm(hidden)  # (B, T, V), or (N, V)
        nsp_logits = self.nsp(self.bert.pooler(out.first())) if self.nsp is not None else None  # (B, 2)
        mlm_loss = nsp_loss = None
        if labels is not None:
            mlm_loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                                       ignore_index=IGNORE_INDEX)
        if next_sentence_label is not None:
            nsp_loss = F.cross_entropy(nsp_logits.float(), next_sentence_label.reshape(-1),
                                       ignore_index=IGNORE_INDEX)
        losses = [l for l in (mlm_loss, nsp_loss) if l is not None]
        loss = sum(losses[1:], losses[0]) if losses else None
        return PreTrainingOutput(loss, logits, nsp_logits, mlm_loss, nsp_loss, out.hidden_states, out.attentions)


class BertForMaskedLM(BertForPreTraining):
    """The masked-LM head only, in any family (RoBERTa's model; ELECTRA's generator)."""

    architecture = "BertForMaskedLM"
    head_family = "mlm"
    with_pair_head = False


class BertForCausalLM(BertForMaskedLM):
    """A causal (GPT-style) LM: the same encoder with `config.causal`, the MLM head scoring the next token."""

    architecture = "BertLMHeadModel"

    def __init__(self, config: BertConfig) -> None:
        if not config.causal:
            raise ValueError("BertForCausalLM needs a causal config (causal=True); without it every token sees "
                             "the one it is asked to predict")
        super().__init__(config)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:
        """labels: (B, T) the token ids themselves (IGNORE_INDEX to skip); position t is scored on token t + 1."""
        out = self.bert(input_ids, attention_mask, token_type_ids)
        logits = self.mlm(out.last_hidden_state)  # (B, T, V): scores for the token after each position
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1),
                                   ignore_index=IGNORE_INDEX)
        return TaskOutput(loss, logits)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, temperature: float = 0.0,
                 top_k: int | None = None, eos_token_id: int | None = None,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Continue each row of `input_ids` (B, T0), unpadded, by up to `max_new_tokens` tokens -> (B, T0 + n).

        temperature 0 is greedy (argmax); above 0 samples from softmax(logits / temperature), among the `top_k`
        best when given. Stops early when every row produced `eos_token_id`, or when the positions run out. No
        key/value cache: each step reruns the prefix, which is fine for the quick checks this is for.
        """
        was_training = self.training
        self.eval()
        ids = input_ids
        for _ in range(max_new_tokens):
            if ids.shape[1] >= self.config.max_length:
                break
            logits = self(ids).logits[:, -1].float()  # (B, V) scores for the next token
            if temperature <= 0:
                token = logits.argmax(-1)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                token = torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(1)
            ids = torch.cat([ids, token[:, None]], dim=1)
            if eos_token_id is not None and bool((token == eos_token_id).all()):
                break
        self.train(was_training)
        return ids


class BertForReplacedTokenDetection(PreTrainedModel):
    """ELECTRA's discriminator: for every token, was it replaced? (transformers' ElectraForPreTraining)."""

    architecture = "BertForReplacedTokenDetection"  # ElectraForPreTraining in the electra format
    head_family = "discriminator"
    requires_pretrained_heads = True

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooler=False)
        self.rtd = TokenDetectionHead(config)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                output_hidden_states: bool = False) -> TaskOutput:
        """labels: (B, T) 1 = replaced, 0 = original. The loss is the mean binary cross-entropy over real tokens."""
        out = self.bert(input_ids, attention_mask, token_type_ids, output_hidden_states)
        logits = self.rtd(out.last_hidden_state)  # (B, T)
        loss = None
        if labels is not None:
            real = torch.ones_like(labels, dtype=torch.bool) if attention_mask is None else attention_mask != 0
            loss = F.binary_cross_entropy_with_logits(logits[real].float(), labels[real].float())
        return TaskOutput(loss, logits, out.hidden_states)


@dataclass
class ElectraOutput:
    """One replaced-token-detection step; the losses are left to `bertkit.objectives.ElectraObjective`."""

    mlm_logits: torch.Tensor  # (N, V) generator scores at the N masked positions (row-major)
    mlm_labels: torch.Tensor  # (N,) the original tokens there
    rtd_logits: torch.Tensor  # (B, T) discriminator scores, > 0 = "replaced"
    rtd_labels: torch.Tensor  # (B, T) 1.0 where the discriminator's input differs from the original, else 0.0
    corrupted_ids: torch.Tensor  # (B, T) what the discriminator saw


def generator_config_for(config: BertConfig, fraction: float = 0.25) -> BertConfig:
    """ELECTRA's generator for discriminator `config`: hidden size x fraction (1/4 in the paper for small/base,
    1/3 for large), A = H/64 heads, 4H intermediate, same layers and the same E-wide embeddings."""
    hidden = max(1, round(config.hidden_size * fraction))
    heads = max(1, hidden // 64)
    while hidden % heads:
        heads -= 1
    return dataclasses.replace(config, hidden_size=hidden, num_attention_heads=heads, intermediate_size=4 * hidden,
                               embedding_size=config.embedding_width)  # E = H: no projection, set to None


class GeneratorDiscriminator(nn.Module):
    """ELECTRA pretraining: a small MLM generator fills the masked positions with samples from its softmax, and the
    discriminator learns to tell, for every token, whether it is the original.

    Both models share one set of embedding tables (word, position, token type and their LayerNorm), as in the
    paper; each keeps its own E -> H projection. `save_pretrained` writes the discriminator as an
    ElectraForPreTraining directory (the model to fine-tune) and the generator as ElectraForMaskedLM in
    `generator/` inside it.
    """

    def __init__(self, config: BertConfig, generator_config: BertConfig | None = None,
                 generator_fraction: float = 0.25) -> None:
        super().__init__()
        generator_config = generator_config or generator_config_for(config, generator_fraction)
        for name in ("vocab_size", "embedding_width", "max_position_embeddings", "type_vocab_size", "pad_token_id",
                     "layer_norm_eps", "hidden_dropout_prob", "model_type"):
            if getattr(config, name) != getattr(generator_config, name):
                raise ValueError(f"generator and discriminator must agree on {name} to share embeddings: "
                                 f"{getattr(generator_config, name)!r} vs {getattr(config, name)!r}")
        self.config, self.generator_config = config, generator_config
        self.discriminator = BertForReplacedTokenDetection(config)
        self.generator = BertForMaskedLM(generator_config)
        shared = self.discriminator.bert.embeddings
        self.generator.bert.embeddings = shared  # one module under two names: one set of parameters
        self.generator.mlm.word_embeddings = shared.word  # the generator's decoder stays tied to the shared table

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> ElectraOutput:
        """input_ids: (B, T) masked ids; labels: (B, T) original ids at masked positions, IGNORE_INDEX elsewhere."""
        masked = labels != IGNORE_INDEX if labels is not None else torch.zeros_like(input_ids, dtype=torch.bool)
        gen = self.generator(input_ids, attention_mask, token_type_ids, predict_at=masked)  # (N, V)
        original = torch.where(masked, labels, input_ids) if labels is not None else input_ids
        corrupted = original.clone()
        if gen.prediction_logits.shape[0]:
            with torch.no_grad():  # sampling is not differentiable: the generator learns from its MLM loss alone
                probs = gen.prediction_logits.detach().float().softmax(-1)
                corrupted[masked] = torch.multinomial(probs, 1).squeeze(1)
        # A sample that happens to equal the original is no replacement: the discriminator must call it original.
        replaced = (corrupted != original).float()
        disc = self.discriminator(corrupted, attention_mask, token_type_ids)
        return ElectraOutput(gen.prediction_logits, original[masked], disc.logits, replaced, corrupted)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def save_pretrained(self, directory: str | Path, tokenizer=None) -> None:
        """The discriminator to `directory`, the generator to `directory/generator` (both transformers' format)."""
        self.discriminator.save_pretrained(directory, tokenizer=tokenizer)
        self.generator.save_pretrained(Path(directory) / "generator", tokenizer=tokenizer)

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> "GeneratorDiscriminator":
        """Rebuild from `save_pretrained` output (both models, embeddings shared again)."""
        discriminator = BertForReplacedTokenDetection.from_pretrained(directory)
        generator = BertForMaskedLM.from_pretrained(Path(directory) / "generator")
        model = cls(discriminator.config, generator.config)
        model.generator.load_state_dict(generator.state_dict())
        model.discriminator.load_state_dict(discriminator.state_dict())  # last: its tables are the shared ones
        return model


# ------------------------------------------------------------------------------------------------------------------
# Task models (fine-tuning): a small head on the encoder, as in the BERT paper, section 4
# ------------------------------------------------------------------------------------------------------------------
class _LabelledHead(PreTrainedModel):
    """Shared by models whose head predicts one of `num_labels` named labels."""

    head_family = "classifier"

    def __init__(self, config: BertConfig, num_labels: int = 2, labels: list[str] | None = None,
                 regression: bool = False, add_pooler: bool = True) -> None:
        super().__init__()
        if labels is not None and len(labels) != num_labels:
            raise ValueError(f"{len(labels)} label names for num_labels={num_labels}")
        if regression and num_labels != 1:
            raise ValueError("a regression head has num_labels=1")
        self.config, self.num_labels = config, num_labels
        self.labels = list(labels) if labels is not None else [f"LABEL_{i}" for i in range(num_labels)]
        self.regression = regression
        if add_pooler and not config.family.pooler:
            raise NotImplementedError(f"{type(self).__name__} reads the pooled [CLS] vector, and {config.model_type} "
                                      f"has no pooler; its own classification head is not implemented")
        self.bert = BertModel(config, add_pooler=add_pooler)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = Linear(config.hidden_size, num_labels)

    @classmethod
    def kwargs_from_config(cls, raw: dict) -> dict:
        id2label = raw.get("id2label")
        if not id2label:
            return {}
        labels = [id2label[str(i)] if str(i) in id2label else id2label[i] for i in range(len(id2label))]
        return {"num_labels": len(labels), "labels": labels, "regression": raw.get("problem_type") == "regression"}

    def config_extras(self) -> dict:
        extras = {"id2label": {str(i): name for i, name in enumerate(self.labels)},
                  "label2id": {name: i for i, name in enumerate(self.labels)}}
        if self.regression:
            extras["problem_type"] = "regression"
        return extras


class BertForSequenceClassification(_LabelledHead):
    """[CLS] pooled output -> dropout -> linear: classification (cross-entropy) or, with one output, regression."""

    architecture = "BertForSequenceClassification"

    def __init__(self, config: BertConfig, num_labels: int = 2, labels: list[str] | None = None,
                 regression: bool = False) -> None:
        super().__init__(config, num_labels, labels, regression or num_labels == 1)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:
        """labels: (B,) class ids, or (B,) floats for regression."""
        out = self.bert(input_ids, attention_mask, token_type_ids)
        logits = self.classifier(self.dropout(out.pooler_output))  # (B, num_labels)
        loss = None
        if labels is not None:
            if self.regression:
                loss = F.mse_loss(logits.squeeze(-1).float(), labels.float())
            else:
                loss = F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX)
        return TaskOutput(loss, logits)


class BertForTokenClassification(_LabelledHead):
    """Every token's output -> dropout -> linear (NER, tagging); labels on first sub-words, IGNORE_INDEX elsewhere."""

    architecture = "BertForTokenClassification"

    def __init__(self, config: BertConfig, num_labels: int = 2, labels: list[str] | None = None,
                 regression: bool = False) -> None:
        super().__init__(config, num_labels, labels, False, add_pooler=False)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:
        """labels: (B, T) label ids, IGNORE_INDEX where no label applies."""
        out = self.bert(input_ids, attention_mask, token_type_ids)
        logits = self.classifier(self.dropout(out.last_hidden_state))  # (B, T, num_labels)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.reshape(-1, self.num_labels).float(), labels.reshape(-1),
                                   ignore_index=IGNORE_INDEX)
        return TaskOutput(loss, logits)


class BertForMultipleChoice(_LabelledHead):
    """One [CLS] score per (context, choice) pair, softmax over the choices (SWAG)."""

    architecture = "BertForMultipleChoice"

    def __init__(self, config: BertConfig, num_labels: int = 1, labels: list[str] | None = None,
                 regression: bool = False) -> None:
        super().__init__(config, 1, None, False)
        self.init_weights()

    def config_extras(self) -> dict:
        return {}

    @classmethod
    def kwargs_from_config(cls, raw: dict) -> dict:
        return {}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:
        """input_ids, attention_mask, token_type_ids: (B, C, T) for C choices; labels: (B,) the right choice."""
        B, C, T = input_ids.shape
        flat = [None if t is None else t.reshape(B * C, T) for t in (attention_mask, token_type_ids)]
        out = self.bert(input_ids.reshape(B * C, T), *flat)
        logits = self.classifier(self.dropout(out.pooler_output)).view(B, C)  # (B, C)
        loss = None if labels is None else F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX)
        return TaskOutput(loss, logits)


class BertForQuestionAnswering(PreTrainedModel):
    """Extractive QA: a start and an end score for every token (SQuAD); position 0 ([CLS]) means no answer."""

    architecture = "BertForQuestionAnswering"
    head_family = "qa"

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooler=False)
        self.qa = Linear(config.hidden_size, 2)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, start_positions: torch.Tensor | None = None,
                end_positions: torch.Tensor | None = None) -> TaskOutput:
        """start_positions, end_positions: (B,) token indices of the answer span (0 when there is none)."""
        out = self.bert(input_ids, attention_mask, token_type_ids)
        logits = self.qa(out.last_hidden_state)  # (B, T, 2)
        loss = None
        if start_positions is not None and end_positions is not None:
            T = logits.shape[1]
            # Positions outside the window are clamped to T and ignored, as in the reference implementation.
            start = start_positions.clamp(0, T)
            end = end_positions.clamp(0, T)
            loss = (F.cross_entropy(logits[..., 0].float(), start, ignore_index=T)
                    + F.cross_entropy(logits[..., 1].float(), end, ignore_index=T)) / 2
        return TaskOutput(loss, logits)


def set_fast_paths(model: nn.Module, unpad: bool | None = None, fused_qkv: bool | None = None,
                   onednn: bool | None = None) -> nn.Module:
    """Switch the fast paths of every encoder in `model` (None leaves a switch as it is); returns `model`.

    unpad: run on the real tokens only when a batch has padding or packed rows (`Unpadded`); fused_qkv: one
    query/key/value matmul; onednn: float32 CPU matmuls of the linear layers and the MLM decoder on oneDNN's
    kernels (`linear`). Each computes what the plain path computes (within float rounding); the plain path
    is there to check that, and for `output_attentions`.
    """
    for module in model.modules():
        if isinstance(module, BertModel) and unpad is not None:
            module.unpad = unpad
        if isinstance(module, SelfAttention) and fused_qkv is not None:
            module.fused_qkv = fused_qkv
        if isinstance(module, (Linear, MaskedLMHead)) and onednn is not None:
            module.onednn = onednn
    return model


def compile_layers(model: nn.Module, backend: str = "inductor") -> nn.Module:
    """torch.compile every encoder layer of `model` in place (regional compilation: one compiled layer, reused by
    all, compiles in seconds where the whole model takes minutes); returns `model`.

    Shapes are dynamic (the unpadded path sees a new token count every batch). When compilation fails, that layer
    runs eagerly, with a warning, instead of failing the run.
    """
    import torch._dynamo

    torch._dynamo.config.suppress_errors = True  # the fallback: eager execution of what cannot be compiled
    for module in model.modules():
        if isinstance(module, Layer):
            module.compile(dynamic=True, backend=backend)
    return model


def check_inputs(config: BertConfig, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                 token_type_ids: torch.Tensor | None) -> None:
    """Refuse inputs the model cannot embed, with a message that says which tensor and why."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (batch, seq_len), got shape {tuple(input_ids.shape)}")
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"input_ids must be an integer tensor, got {input_ids.dtype}")
    T = input_ids.shape[1]
    if T > config.max_length:
        offset = (f", less the {config.pad_token_id + 1} that padding-offset positions skip"
                  if config.padding_offset_positions else "")
        raise ValueError(f"sequence length {T} is longer than max_position_embeddings "
                         f"({config.max_position_embeddings}{offset}); truncate the input (e.g. "
                         f"max_length={config.max_length})")
    for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
        if t is not None and t.shape != input_ids.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but input_ids has {tuple(input_ids.shape)}")
    if input_ids.numel() and not input_ids.is_cuda:  # a device sync on GPU; out-of-range ids fail loudly there anyway
        low, high = int(input_ids.min()), int(input_ids.max())
        if low < 0 or high >= config.vocab_size:
            raise ValueError(f"input_ids contain id {high if high >= config.vocab_size else low} outside the "
                             f"vocabulary [0, {config.vocab_size}); does the tokenizer match the model?")
        if token_type_ids is not None and token_type_ids.numel() and config.type_vocab_size:  # 0: ignored
            tt = int(token_type_ids.max())
            if tt >= config.type_vocab_size or int(token_type_ids.min()) < 0:
                raise ValueError(f"token_type_ids contain {tt}, but type_vocab_size is {config.type_vocab_size}")
