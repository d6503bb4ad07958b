"""XLNet: a Transformer-XL encoder with two-stream self-attention, trained by permutation language modelling; its
LM head, sequence-summary classifiers, token classifier, multiple choice and a start/end span head.

Read it top to bottom: relative position helpers, masks, two-stream relative attention, the feed-forward block, one
layer, the encoder, then the models. Shapes use B = batch, T = segment length, M = memory length, K = M + T (the
keys: memory then segment), P = predicted positions (rows of target_mapping), H = d_model, N = heads,
D = H / N (head size), V = vocabulary size. Tensors are batch-first throughout (transformers' XLNet runs
length-first inside; the numbers are the same).

What XLNet adds to a BERT-like encoder, each where it acts:

    two streams     the content stream h sees a token's own content (as BERT's hidden states do); the query stream
                    g starts from one learned vector (`mask_emb`) at every predicted position and sees the
                    position but not the content of the token it predicts. Both streams share every weight.
    permutation     perm_mask[b, i, j] = 1: token i may not see token j (j comes later in the factorisation
                    order). The content stream lets a token see itself besides; the query stream does not.
    target mapping  target_mapping[b, p, j] = 1: prediction p is the token at position j; the query stream runs
                    only for those (the LM head scores P rows, not T).
    relative        no position table: a query at position i and a key at position j score with the sinusoid of
    positions       their distance i - j through its own projection `r`, plus two learned biases per head
                    (r_w_bias on the content term, r_r_bias on the position term) and the relative shift
    segments        no token-type table: each head learns two vectors, "same segment" and "other segment"
                    (seg_embed, with r_s_bias), and a query-key pair scores with the one that applies
    memory          `mems`: the content stream's input to each layer from the previous segment (M tokens, no
                    gradient) is prepended to the keys and values, so a segment sees the one before it;
                    `use_mems=True` returns the new memories (the first reuse_len tokens, the last mem_len kept)
    bi_data         the second half of the batch reads its relative positions backwards (pretraining)
    post-norm       each attention and feed-forward block: x = LayerNorm(x + dropout(block(x))), as BERT
    heads           the LM head is the token embeddings (tied) plus a bias; classifiers summarise a sequence by
                    its last token (<cls>: XLNet puts it at the end and pads on the left) -> dense -> tanh

Padding: a padded key is hidden from every query, and relative positions depend only on distances, so a real
token's vectors are the same whichever side the padding is on; the summary reads each row's last real token,
which is position T - 1 on XLNet's left-padded batches (transformers reads position T - 1 whatever is there).

The fast path (`XLNetModel.gather_targets`, on by default): when every row of target_mapping is one-hot or zero,
as the pretraining data makes it, the query stream attends from the P predicted positions only (their rows of the
masks, segments and relative distances gathered); transformers moves the P queries to all T positions, attends from
every one and maps back, the same numbers for T / P times the work. tests/models/test_xlnet.py pins the two paths
to each other, gradients included.

Inside, modules carry short names of our own; on disk a model directory has transformers' XLNet names and
config.json, through the "xlnet" table of `bertkit.checkpoint`. tests/models/test_xlnet.py pins every model to
transformers' on tiny random configs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from bertkit.config import XLNetConfig
from bertkit.models.bert import FeedForward, PreTrainedModel, TaskOutput, init_module, sequence_loss, token_loss
from bertkit.models.heads import NamedLabels, last_real_token, span_loss
from bertkit.models.kernels import Linear, linear
from bertkit.models.layouts import check_ids, check_ids_in_vocabulary, host_copy, reshape

NEG_INF = -1e30  # the score of a hidden key (transformers' value: a row with every key hidden comes out uniform)


# ------------------------------------------------------------------------------------------------------------------
# Relative positions and masks
# ------------------------------------------------------------------------------------------------------------------
def relative_positions(T: int, K: int, d_model: int, bi_data: bool, clamp_len: int, device) -> torch.Tensor:
    """The sinusoids of every relative distance a query can have to a key: (1 or 2, K + T, H).

    Row p is distance K - p (from K, the farthest memory key, down to -(T - 1)): the distances K .. -T + 1 that
    queries 0 .. T - 1 at positions M .. K - 1 have to keys 0 .. K - 1, with one spare row the relative shift
    drops. With bi_data a second set reads the distances backwards (for the second half of the batch).
    """
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d_model, 2, device=device).float() / d_model))  # (H/2,)
    forward = torch.arange(K, -T, -1, device=device).float()  # (K + T,)
    sets = [forward, -forward] if bi_data else [forward]
    if clamp_len > 0:
        sets = [s.clamp(-clamp_len, clamp_len) for s in sets]
    angles = torch.stack(sets)[..., None] * inv_freq  # (1 or 2, K + T, H/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)  # (1 or 2, K + T, H)


def relative_shift(scores: torch.Tensor, K: int) -> torch.Tensor:
    """(B, N, T, K + T) scores by (query i, distance row p) -> (B, N, T, K) by (query i, key j).

    Query i (at position M + i) and key j are K - p apart for p = T - i + j, so row i must move left by T - i:
    viewing the (T, K + T) block as (K + T, T), dropping its first row and viewing it back as (T, K + T - 1) does
    exactly that (Transformer-XL's trick, no gather); the first K columns are the keys.
    """
    B, N, T, R = scores.shape
    shifted = scores.reshape(B, N, R, T)[:, :, 1:].reshape(B, N, T, R - 1)
    return shifted[..., :K]


def attention_masks(attention_mask: torch.Tensor | None, perm_mask: torch.Tensor | None, M: int, T: int,
                    B: int, device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """What each query may not see: (content stream, query stream) bool masks (B, T, K), True = hidden, or None
    when nothing is hidden.

    attention_mask (B, T): 1 = real token, 0 = padding (a padding key is hidden from everyone); perm_mask
    (B, T, T): 1 = query i may not see token j. Memory is never hidden. The content stream may always see its own
    token; the query stream sees exactly what perm_mask and padding allow (itself hidden by perm_mask).
    """
    hidden = None
    if attention_mask is not None:
        hidden = (attention_mask == 0)[:, None, :].expand(B, T, T)  # (B, T, T): padding keys
    if perm_mask is not None:
        hidden = perm_mask > 0 if hidden is None else hidden | (perm_mask > 0)
    if hidden is None:
        return None, None
    if M:
        hidden = torch.cat([hidden.new_zeros(B, T, M), hidden], dim=2)  # (B, T, K): memory is visible
    own = torch.zeros(T, M + T, dtype=torch.bool, device=device)
    own[:, M:] = torch.eye(T, dtype=torch.bool, device=device)
    return hidden & ~own, hidden  # content stream: hidden except itself; query stream: as given


def segment_differs(token_type_ids: torch.Tensor | None, M: int) -> torch.Tensor | None:
    """(B, T) segment ids -> (B, T, K) float: 1 where query i and key j are in different segments (memory counts as
    segment 0), None without segments."""
    if token_type_ids is None:
        return None
    keys = token_type_ids if not M else torch.cat([token_type_ids.new_zeros(token_type_ids.shape[0], M),
                                                   token_type_ids], dim=1)  # (B, K)
    return (token_type_ids[:, :, None] != keys[:, None, :]).float()


# ------------------------------------------------------------------------------------------------------------------
# Blocks
# ------------------------------------------------------------------------------------------------------------------
@dataclass
class Context:
    """What every layer's attention shares in one forward pass: relative sinusoids, masks, segments, and where the
    predictions are."""

    positions: torch.Tensor  # (1 or 2, K + T, H) relative sinusoids (dropout applied)
    mask_h: torch.Tensor | None  # (B, T, K) bool, content stream: True = hidden
    mask_g: torch.Tensor | None  # (B, T, K) bool, query stream
    segments: torch.Tensor | None  # (B, T, K) float, 1 = other segment
    target_mapping: torch.Tensor | None  # (B, P, T) which position each prediction is
    # The fast path for one-hot target mappings (`targets`): each prediction's position (B, P) and whether its row
    # of target_mapping is set (B, P, 1; a zero row predicts nothing), so the query stream attends from the P
    # predicted positions only instead of from all T.
    target_rows: torch.Tensor | None = None
    target_set: torch.Tensor | None = None


def targets(target_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(positions (B, P), set (B, P, 1)) when every row of target_mapping (B, P, T) is one-hot or zero and no two
    predictions of a row share a position (what the pretraining data gives); None otherwise (the general linear
    map then runs, as transformers computes it). The test reads the host copy where the mapping has one
    (`attach_host`: the training loop's batches), so it waits for no device."""
    host = host_copy(target_mapping)
    tm = target_mapping if host is None else host
    if not (((tm == 0) | (tm == 1)).all() and (tm.sum(-1) <= 1).all() and (tm.sum(1) <= 1).all()):
        return None
    return target_mapping.argmax(-1), target_mapping.sum(-1, keepdim=True)


class RelativeAttention(nn.Module):
    """Two-stream multi-head attention with relative positions and segments, then residual + LayerNorm.

    The projections are transformers' (H, N, D) tensors q, k, v, o, r (applied as one matmul each); r_w_bias,
    r_r_bias, r_s_bias (N, D) bias the query for the content, position and segment terms; seg_embed (2, N, D) holds
    each head's "same segment" and "other segment" vectors.
    """

    def __init__(self, config: XLNetConfig) -> None:
        super().__init__()
        H, N, D = config.d_model, config.n_head, config.head_dim
        self.num_heads, self.head_dim, self.scale = N, D, D ** -0.5
        for name in ("q", "k", "v", "o", "r"):
            setattr(self, name, nn.Parameter(torch.empty(H, N, D)))
        for name in ("r_w_bias", "r_r_bias", "r_s_bias"):
            setattr(self, name, nn.Parameter(torch.empty(N, D)))
        self.seg_embed = nn.Parameter(torch.empty(2, N, D))
        self.norm = nn.LayerNorm(H, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)

    def project(self, x: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
        """x (..., L, H) through the (H, N, D) projections side by side -> (..., L, len(weights) * N * D)."""
        H = x.shape[-1]
        w = weights[0].reshape(H, -1) if len(weights) == 1 else torch.cat([w.reshape(H, -1) for w in weights], 1)
        return linear(x, w.t())  # oneDNN reads the transposed view without a copy

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_r: torch.Tensor, mask: torch.Tensor | None,
             segments: torch.Tensor | None, rows: torch.Tensor | None = None) -> torch.Tensor:
        """One stream's attention. q (B, Q, N, D) queries; k, v (B, N, K, D); k_r (1 or 2, N, K + T, D) projected
        sinusoids; mask (B, Q, K) bool, True = hidden; segments (B, Q, K) 1 = other segment; rows (B, Q): each
        query's position (None: query i is at position i, Q = T) -> context (B, Q, N * D)."""
        B, Q, N, D = q.shape
        K = k.shape[2]
        # Scaled once here, on the (B, N, Q, D) queries and the biases, rather than on every (B, N, Q, K) score.
        q = q.transpose(1, 2) * self.scale  # (B, N, Q, D)
        content = torch.matmul(q + self.r_w_bias[:, None] * self.scale, k.transpose(-1, -2))  # (B, N, Q, K)
        q_r = q + self.r_r_bias[:, None] * self.scale
        if k_r.shape[0] == 2:  # bi_data: the first half of the batch reads forward distances, the second backward
            half = B // 2
            position = torch.cat([torch.matmul(q_r[:half], k_r[0].transpose(-1, -2)),
                                  torch.matmul(q_r[half:], k_r[1].transpose(-1, -2))])
        else:
            position = torch.matmul(q_r, k_r[0].transpose(-1, -2))  # (B, N, Q, K + T)
        if rows is None:
            position = relative_shift(position, K)  # (B, N, T, K)
        else:  # query at position i, key j: distance row T - i + j (see `relative_shift`)
            T = k_r.shape[2] - K
            index = (T - rows)[:, :, None] + torch.arange(K, device=q.device)  # (B, Q, K)
            position = position.gather(3, index[:, None].expand(B, N, Q, K))
        scores = content + position  # (B, N, Q, K)
        if segments is not None:
            # (B, N, Q, 2): each query against the head's "same" and "other" segment vectors. The "same" score is
            # one number per query row, which the softmax over the keys does not see: only the difference is added.
            seg = torch.einsum("bnqd,snd->bnqs", q + self.r_s_bias[:, None] * self.scale, self.seg_embed)
            scores = torch.addcmul(scores, segments[:, None], seg[..., 1:] - seg[..., :1])
        if mask is not None:
            scores = scores.masked_fill(mask[:, None], NEG_INF)
        probs = self.dropout(torch.softmax(scores, dim=-1))
        return torch.matmul(probs, v).transpose(1, 2).reshape(B, Q, N * D)  # (B, Q, N * D)

    def output(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """Project the heads back (through o), dropout, residual, LayerNorm."""
        H = x.shape[-1]
        return self.norm(x + self.dropout(linear(context, self.o.reshape(H, -1))))

    def forward(self, h: torch.Tensor, g: torch.Tensor | None, mem: torch.Tensor | None,
                ctx: Context) -> tuple[torch.Tensor, torch.Tensor | None]:
        """h (B, T, H) content stream; g (B, P, H) query stream or None; mem (B, M, H) or None -> new (h, g)."""
        B, T, H = h.shape
        N, D = self.num_heads, self.head_dim
        if mem is None:  # one matmul gives queries, keys and values
            q, k, v = self.project(h, self.q, self.k, self.v).view(B, T, 3, N, D).unbind(2)
        else:
            q = self.project(h, self.q).view(B, T, N, D)
            k, v = self.project(torch.cat([mem, h], dim=1), self.k, self.v).view(B, -1, 2, N, D).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # (B, N, K, D)
        S, R = ctx.positions.shape[:2]
        k_r = self.project(ctx.positions, self.r).view(S, R, N, D).transpose(1, 2)  # (1 or 2, N, K + T, D)
        new_h = self.output(h, self.core(q, k, v, k_r, ctx.mask_h, ctx.segments))
        if g is None:
            return new_h, None
        q_g = self.project(g, self.q).view(B, -1, N, D)  # (B, P or T, N, D)
        if ctx.target_rows is not None:  # each prediction attends from its own position
            rows = ctx.target_rows
            pick = rows[:, :, None].expand(-1, -1, k.shape[2])  # (B, P, K)
            mask = None if ctx.mask_g is None else ctx.mask_g.gather(1, pick)
            segments = None if ctx.segments is None else ctx.segments.gather(1, pick)
            context = self.core(q_g, k, v, k_r, mask, segments, rows) * ctx.target_set  # zero rows predict nothing
        elif ctx.target_mapping is not None:
            # Each prediction's query moves to the position it predicts, attends from there, and comes back.
            q_g = torch.einsum("bpnd,bpt->btnd", q_g, ctx.target_mapping)  # (B, T, N, D)
            context = self.core(q_g, k, v, k_r, ctx.mask_g, ctx.segments)  # (B, T, N * D)
            context = torch.bmm(ctx.target_mapping, context)  # (B, P, N * D)
        else:
            context = self.core(q_g, k, v, k_r, ctx.mask_g, ctx.segments)
        return new_h, self.output(g, context)


class Layer(nn.Module):
    """Relative two-stream attention, then the feed-forward block on each stream (shared weights)."""

    def __init__(self, config: XLNetConfig) -> None:
        super().__init__()
        self.attn = RelativeAttention(config)
        # up -> activation -> dropout -> down -> dropout, then residual + LayerNorm
        self.ffn = FeedForward(config.d_model, config.d_inner, config.ff_activation, config.dropout,
                               config.layer_norm_eps, inner_dropout=True)

    def forward(self, h: torch.Tensor, g: torch.Tensor | None, mem: torch.Tensor | None,
                ctx: Context) -> tuple[torch.Tensor, torch.Tensor | None]:
        h, g = self.attn(h, g, mem, ctx)
        return self.ffn(h), (self.ffn(g) if g is not None else None)


# ------------------------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------------------------
@dataclass
class XLNetOutput:
    """last_hidden_state: (B, T, H) the content stream, or (B, P, H) the query stream when it ran; mems: one (B, M',
    H) tensor per layer (use_mems=True); hidden_states: the content stream's input to every layer and the last
    output, L + 1 tensors (B, T, H) (output_hidden_states=True)."""

    last_hidden_state: torch.Tensor
    mems: list[torch.Tensor] | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None


@dataclass
class XLNetLMOutput:
    """loss (mean over labelled rows), logits (B, T or P, V), and the encoder's mems and hidden states."""

    loss: torch.Tensor | None
    logits: torch.Tensor
    mems: list[torch.Tensor] | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None


class XLNetPreTrainedModel(PreTrainedModel):
    """XLNet's initialisation (normal(0, initializer_range) for every weight, the attention tensors included; zero
    biases, unit norms); model-directory io is bertkit's."""

    config: XLNetConfig
    config_class = XLNetConfig  # what `from_pretrained` reads config.json as
    encoder_prefix = "encoder."  # where the encoder sits in the task models' parameter names

    def init_weights(self) -> None:
        std = self.config.initializer_range
        for module in self.modules():
            init_module(module, std)
            if isinstance(module, RelativeAttention):
                for p in (module.q, module.k, module.v, module.o, module.r, module.r_w_bias, module.r_r_bias,
                          module.r_s_bias, module.seg_embed):
                    nn.init.normal_(p, std=std)
            elif isinstance(module, XLNetModel):
                nn.init.normal_(module.mask_emb, std=std)
        lm_bias = getattr(self, "lm_bias", None)
        if lm_bias is not None:
            nn.init.zeros_(lm_bias)


class XLNetModel(XLNetPreTrainedModel):
    """The encoder: token ids (and a permutation) -> the content stream (B, T, H), or the query stream (B, P, H)."""

    architecture = "XLNetModel"
    encoder_prefix = ""
    gather_targets = True  # the query stream attends from the predicted positions only (False: transformers' way)

    def __init__(self, config: XLNetConfig) -> None:
        super().__init__()
        self.config = config
        self.word = nn.Embedding(config.vocab_size, config.d_model)
        self.mask_emb = nn.Parameter(torch.empty(1, 1, config.d_model))  # the query stream's starting vector
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.n_layer))
        self.dropout = nn.Dropout(config.dropout)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, mems: list[torch.Tensor] | None = None,
                perm_mask: torch.Tensor | None = None, target_mapping: torch.Tensor | None = None,
                use_mems: bool = False, output_hidden_states: bool = False) -> XLNetOutput:
        """input_ids (B, T); attention_mask (B, T) 1 = real, 0 = padding; token_type_ids (B, T) segment ids (only
        equality matters: XLNet's A = 0, B = 1, <cls> = 2); mems: L tensors (B, M, H) from the previous segment;
        perm_mask (B, T, T) 1 = i may not see j; target_mapping (B, P, T) one-hot rows (zero rows: no prediction).

        The query stream runs when target_mapping is given (its P rows are the output); otherwise the output is
        the content stream. With use_mems, `mems` of the output are each layer's content-stream input, its first
        reuse_len tokens appended to the old memory and the last mem_len kept (detached)."""
        check_inputs(self.config, input_ids, attention_mask, mems, perm_mask, target_mapping)
        config = self.config
        B, T = input_ids.shape
        M = mems[0].shape[1] if mems else 0
        device = input_ids.device
        mask_h, mask_g = attention_masks(attention_mask, perm_mask, M, T, B, device)
        if config.bi_data and B % 2:
            raise ValueError(f"bi_data reads half of the batch backwards: the batch size must be even, got {B}")
        positions = relative_positions(T, M + T, config.d_model, config.bi_data, config.clamp_len, device)
        dtype = self.word.weight.dtype
        ctx = Context(self.dropout(positions.to(dtype)), mask_h, mask_g, segment_differs(token_type_ids, M),
                      None if target_mapping is None else target_mapping.to(dtype))
        picked = targets(target_mapping) if target_mapping is not None and self.gather_targets else None
        if picked is not None:
            ctx.target_rows, ctx.target_set = picked[0], picked[1].to(dtype)
        h = self.dropout(self.word(input_ids))  # (B, T, H)
        g = None
        if target_mapping is not None:
            g = self.dropout(self.mask_emb.expand(B, target_mapping.shape[1], -1))  # (B, P, H)
        new_mems: list[torch.Tensor] = []
        hidden = [] if output_hidden_states else None
        for i, layer in enumerate(self.layers):
            mem = mems[i] if mems else None
            if use_mems:
                new_mems.append(self.cache(h, mem))
            if hidden is not None:
                hidden.append(h)
            h, g = layer(h, g, mem, ctx)
        if hidden is not None:
            hidden.append(h)
        out = self.dropout(g if g is not None else h)
        return XLNetOutput(out, new_mems if use_mems else None, tuple(hidden) if hidden is not None else None)

    def cache(self, h: torch.Tensor, mem: torch.Tensor | None) -> torch.Tensor:
        """The next segment's memory of one layer: the first reuse_len tokens of its input h (B, T, H) after the old
        memory, the last mem_len of them kept, without gradient -> (B, M', H)."""
        reuse, keep = self.config.reuse_len, self.config.mem_len
        new = h[:, :reuse] if reuse else h
        if mem is not None:
            new = torch.cat([mem, new], dim=1)
        return (new[:, -keep:] if keep else new).detach()


class XLNetLMHeadModel(XLNetPreTrainedModel):
    """The encoder and the LM head: the token embeddings (tied) plus a bias, scoring the query stream at the
    predicted positions (permutation LM) or the content stream everywhere."""

    architecture = "XLNetLMHeadModel"
    head_family = "lm"
    requires_pretrained_heads = False  # an encoder's directory gets a zero bias (the weights are the embeddings)

    def __init__(self, config: XLNetConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = XLNetModel(config)
        self.lm_bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, mems: list[torch.Tensor] | None = None,
                perm_mask: torch.Tensor | None = None, target_mapping: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, use_mems: bool = False,
                output_hidden_states: bool = False) -> XLNetLMOutput:
        """As XLNetModel.forward; labels (B, P) (or (B, T) without target_mapping) token ids, IGNORE_INDEX where
        nothing is predicted. logits (B, P or T, V)."""
        out = self.encoder(input_ids, attention_mask, token_type_ids, mems, perm_mask, target_mapping, use_mems,
                           output_hidden_states)
        logits = self.score(out.last_hidden_state)
        return XLNetLMOutput(token_loss(logits, labels), logits, out.mems, out.hidden_states)

    def score(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., V): the tied embeddings and the bias."""
        return linear(hidden, self.encoder.word.weight, self.lm_bias)


class SequenceSummary(nn.Module):
    """One vector per sequence: its last real token (<cls>), first token or mean -> dropout -> dense -> tanh ->
    dropout (transformers' XLNetSequenceSummary, `summary_*` of the config)."""

    def __init__(self, config: XLNetConfig) -> None:
        super().__init__()
        self.kind = config.summary_type
        self.first_dropout = nn.Dropout(config.summary_first_dropout)
        self.dense = Linear(config.d_model, config.d_model) if config.summary_use_proj else None
        self.tanh = config.summary_activation == "tanh"
        self.last_dropout = nn.Dropout(config.summary_last_dropout)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """hidden (B, T, H), attention_mask (B, T) or None -> (B, H)."""
        if self.kind == "last":  # position T - 1 when the padding is on the left (XLNet's side) or absent
            pooled = last_real_token(hidden, attention_mask)
        elif self.kind == "first":
            pooled = hidden[:, 0]
        else:
            pooled = hidden.mean(dim=1)  # transformers' mean: over every position, padding included
        pooled = self.first_dropout(pooled)
        if self.dense is not None:
            pooled = self.dense(pooled)
        if self.tanh:
            pooled = torch.tanh(pooled)
        return self.last_dropout(pooled)


class _Labelled(NamedLabels, XLNetPreTrainedModel):
    """Shared by the classifiers: the encoder, and `num_labels` named labels."""

    head_family = "sequence"

    def _setup(self, config: XLNetConfig, num_labels: int, labels: list[str] | None, regression: bool) -> None:
        self.set_labels(config, num_labels, labels, regression)
        self.encoder = XLNetModel(config)


class XLNetForSequenceClassification(_Labelled):
    """The sequence summary (last token) -> linear: classification (cross-entropy) or, with one output, regression
    (mean squared error); transformers' XLNetForSequenceClassification."""

    architecture = "XLNetForSequenceClassification"

    def __init__(self, config: XLNetConfig, num_labels: int = 2, labels: list[str] | None = None,
                 regression: bool = False) -> None:
        super().__init__()
        self._setup(config, num_labels, labels, regression or num_labels == 1)
        self.summary = SequenceSummary(config)
        self.classifier = Linear(config.d_model, num_labels)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:
        """labels: (B,) class ids, or (B,) floats for regression. logits (B, num_labels)."""
        hidden = self.encoder(input_ids, attention_mask, token_type_ids).last_hidden_state
        logits = self.classifier(self.summary(hidden, attention_mask))
        return TaskOutput(sequence_loss(logits, labels, self.regression), logits)


class XLNetForTokenClassification(_Labelled):
    """Every token -> linear (NER, tagging); transformers' XLNetForTokenClassification."""

    architecture = "XLNetForTokenClassification"
    head_family = "token"

    def __init__(self, config: XLNetConfig, num_labels: int = 2, labels: list[str] | None = None,
                 regression: bool = False) -> None:
        super().__init__()
        self._setup(config, num_labels, labels, False)
        self.classifier = Linear(config.d_model, num_labels)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:
        """labels: (B, T) label ids, IGNORE_INDEX where none applies. logits (B, T, num_labels)."""
        logits = self.classifier(self.encoder(input_ids, attention_mask, token_type_ids).last_hidden_state)
        return TaskOutput(token_loss(logits, labels), logits)


class XLNetForMultipleChoice(_Labelled):
    """One score per (context, choice) pair: the sequence summary -> linear to one output, softmax over the
    choices (SWAG); transformers' XLNetForMultipleChoice."""

    architecture = "XLNetForMultipleChoice"
    named_labels = False

    def __init__(self, config: XLNetConfig, num_labels: int = 1, labels: list[str] | None = None,
                 regression: bool = False) -> None:
        super().__init__()
        self._setup(config, 1, None, False)
        self.summary = SequenceSummary(config)
        self.classifier = Linear(config.d_model, 1)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> TaskOutput:
        """input_ids, attention_mask, token_type_ids: (B, C, T) for C choices; labels (B,). logits (B, C)."""
        B, C, T = input_ids.shape
        flat = [None if x is None else reshape(x, B * C, T) for x in (attention_mask, token_type_ids)]
        hidden = self.encoder(input_ids.reshape(B * C, T), *flat).last_hidden_state
        logits = self.classifier(self.summary(hidden, flat[0])).view(B, C)
        return TaskOutput(sequence_loss(logits, labels), logits)


class XLNetForQuestionAnswering(XLNetPreTrainedModel):
    """Extractive QA with a simple span head: every token -> linear to a start and an end score (transformers'
    XLNetForQuestionAnsweringSimple; XLNet's beam-search head, XLNetForQuestionAnswering, is not built)."""

    architecture = "XLNetForQuestionAnsweringSimple"
    head_family = "qa"

    def __init__(self, config: XLNetConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = XLNetModel(config)
        self.qa = Linear(config.d_model, 2)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, start_positions: torch.Tensor | None = None,
                end_positions: torch.Tensor | None = None) -> TaskOutput:
        """start_positions, end_positions: (B,) token indices of the answer. logits (B, T, 2)."""
        logits = self.qa(self.encoder(input_ids, attention_mask, token_type_ids).last_hidden_state)  # (B, T, 2)
        return TaskOutput(span_loss(logits, start_positions, end_positions), logits)


def check_inputs(config: XLNetConfig, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                 mems: list[torch.Tensor] | None, perm_mask: torch.Tensor | None,
                 target_mapping: torch.Tensor | None) -> None:
    """Refuse inputs the model cannot take, with a message that says which tensor and why."""
    check_ids(input_ids)
    B, T = input_ids.shape
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)} but input_ids has {(B, T)}")
    if perm_mask is not None and tuple(perm_mask.shape) != (B, T, T):
        raise ValueError(f"perm_mask must be (batch, seq_len, seq_len) = {(B, T, T)}, got {tuple(perm_mask.shape)}")
    if target_mapping is not None and (target_mapping.dim() != 3 or tuple(target_mapping.shape[::2]) != (B, T)):
        raise ValueError(f"target_mapping must be (batch, num_predict, seq_len) with batch {B} and seq_len {T}, got "
                         f"{tuple(target_mapping.shape)}")
    if mems:
        if len(mems) != config.n_layer:
            raise ValueError(f"mems has {len(mems)} tensors; the model has {config.n_layer} layers")
        M = mems[0].shape[1]
        for i, mem in enumerate(mems):
            if tuple(mem.shape) != (B, M, config.d_model):
                raise ValueError(f"mems[{i}] must be (batch, mem_len, d_model) = {(B, M, config.d_model)}, got "
                                 f"{tuple(mem.shape)}")
    check_ids_in_vocabulary(input_ids, config.vocab_size)
