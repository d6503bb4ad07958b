"""Every fast path computes what the plain path computes: unpadded attention, packed rows, fused QKV.

The plain path is the padded computation transformers does (pinned against transformers in test_modeling.py and
test_family.py); here each switch is compared with it, forward and backward, within 1e-5 in float32.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import bertkit.models.kernels as kernels
import bertkit.models.layouts as layouts
from bertkit import BertConfig, BertForMaskedLM, BertForPreTraining, BertModel
from bertkit.data.instances import SpecialIds
from bertkit.data.loader import PretrainingStream, StreamOptions
from bertkit.models import (IGNORE_INDEX, BertForCausalLM, BertForQuestionAnswering,
                              BertForSequenceClassification, BertForTokenClassification, Unpadded, set_fast_paths)

from conftest import tiny_config

ATOL = 1e-5
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def padded_batch(config: BertConfig, lengths=(12, 7, 3, 10), T=12, seed=0):
    """Rows of the given real lengths, right-padded to T; MLM labels at a few real positions; NSP labels."""
    g = torch.Generator().manual_seed(seed)
    B = len(lengths)
    ids = torch.randint(5, config.vocab_size, (B, T), generator=g)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids[mask == 0] = config.pad_token_id
    types = torch.zeros(B, T, dtype=torch.long)
    if config.type_vocab_size > 1:
        types[:, T // 2:] = 1
        types[mask == 0] = 0
    labels = torch.full((B, T), IGNORE_INDEX)
    for row, n in enumerate(lengths):
        labels[row, 1:n:3] = ids[row, 1:n:3]
    return ids, mask, types, labels, torch.tensor([i % 2 for i in range(B)])


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_grads(a, b):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=ATOL, rtol=0, msg=name)


def run_pretraining(model, batch, sparse: bool):
    ids, mask, types, labels, nsp = batch
    model.zero_grad(set_to_none=True)
    extra = {"predict_at": labels != IGNORE_INDEX} if sparse else {}
    nsp_label = nsp if model.nsp is not None else None
    out = model(ids, mask, types, labels=labels, next_sentence_label=nsp_label, output_hidden_states=True, **extra)
    out.loss.backward()
    return out, grads(model)


TINY = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=64, **NO_DROPOUT)
CONFIGS = {
    "bert": tiny_config(**NO_DROPOUT),
    "roberta-offset-positions": BertConfig.for_family("roberta", **{**TINY, "type_vocab_size": 1,
                                                                    "pad_token_id": 1}),
    "albert-factorised-shared": BertConfig.for_family("albert", **{**TINY, "embedding_size": 16,
                                                                   "num_hidden_layers": 4, "num_hidden_groups": 1}),
}


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("sparse", [False, True], ids=["dense-mlm", "sparse-mlm"])
def test_unpadded_path_matches_plain_path_forward_and_backward(name, sparse):
    config = CONFIGS[name]
    torch.manual_seed(0)
    model = BertForPreTraining(config).train()  # train mode: the path the trainer takes (dropout off here)
    batch = padded_batch(config)
    real = batch[1].bool()
    set_fast_paths(model, unpad=False)
    plain, plain_grads = run_pretraining(model, batch, sparse)
    set_fast_paths(model, unpad=True)
    fast, fast_grads = run_pretraining(model, batch, sparse)
    torch.testing.assert_close(fast.loss, plain.loss, atol=ATOL, rtol=0)
    for x, y in zip(fast.hidden_states, plain.hidden_states):
        torch.testing.assert_close(x[real], y[real], atol=ATOL, rtol=0)
        assert float(x.detach()[~real].abs().max()) == 0.0  # padding is never computed: it stays 0
    if sparse:
        torch.testing.assert_close(fast.prediction_logits, plain.prediction_logits, atol=ATOL, rtol=0)
    else:
        torch.testing.assert_close(fast.prediction_logits[real], plain.prediction_logits[real], atol=ATOL, rtol=0)
    if plain.seq_relationship_logits is not None:
        torch.testing.assert_close(fast.seq_relationship_logits, plain.seq_relationship_logits, atol=ATOL, rtol=0)
    assert_same_grads(fast_grads, plain_grads)


def test_fused_qkv_matches_three_projections_forward_and_backward():
    config = tiny_config(**NO_DROPOUT)
    torch.manual_seed(1)
    model = BertForPreTraining(config).train()
    batch = padded_batch(config)
    set_fast_paths(model, fused_qkv=False)
    plain, plain_grads = run_pretraining(model, batch, sparse=True)
    set_fast_paths(model, fused_qkv=True)
    fast, fast_grads = run_pretraining(model, batch, sparse=True)
    torch.testing.assert_close(fast.loss, plain.loss, atol=ATOL, rtol=0)
    assert_same_grads(fast_grads, plain_grads)


needs_onednn = pytest.mark.skipif(not kernels._ONEDNN, reason="this torch build has no oneDNN linear kernel")


def count_onednn_calls(monkeypatch) -> list:
    """Make every product large enough for oneDNN and record each matmul it runs (their count is returned live)."""
    calls = []
    real = kernels._onednn_mm

    def counted(x, weight, bias=None):
        calls.append(tuple(x.shape))
        return real(x, weight, bias)

    monkeypatch.setattr(kernels, "ONEDNN_MIN_MACS", 0)
    monkeypatch.setattr(kernels, "_onednn_mm", counted)
    return calls


@needs_onednn
@pytest.mark.parametrize("sparse", [False, True], ids=["dense-mlm", "sparse-mlm"])
def test_onednn_linear_matches_plain_path_forward_and_backward(monkeypatch, sparse):
    config = tiny_config(**NO_DROPOUT)
    torch.manual_seed(2)
    model = BertForPreTraining(config).train()
    batch = padded_batch(config)
    calls = count_onednn_calls(monkeypatch)
    set_fast_paths(model, onednn=False)
    plain, plain_grads = run_pretraining(model, batch, sparse)
    assert calls == []
    set_fast_paths(model, onednn=True)
    fast, fast_grads = run_pretraining(model, batch, sparse)
    # forward: 4 linear layers per encoder layer, MLM transform and decoder, pooler, NSP; backward: 2 per forward
    # product whose input needs a gradient (the first layer's QKV input is the embeddings' output: it does)
    forward = 4 * config.num_hidden_layers + 4
    assert len(calls) == 3 * forward
    torch.testing.assert_close(fast.loss, plain.loss, atol=ATOL, rtol=0)
    torch.testing.assert_close(fast.prediction_logits, plain.prediction_logits, atol=ATOL, rtol=0)
    for x, y in zip(fast.hidden_states, plain.hidden_states):
        torch.testing.assert_close(x, y, atol=ATOL, rtol=0)
    assert_same_grads(fast_grads, plain_grads)


@needs_onednn
def test_onednn_linear_in_inference_and_where_it_stands_aside(monkeypatch):
    config = tiny_config(**NO_DROPOUT)
    torch.manual_seed(3)
    model = BertModel(config).eval()
    ids, mask, types, _, _ = padded_batch(config)
    with torch.no_grad():
        plain = set_fast_paths(model, onednn=False)(ids, mask, types).last_hidden_state
        calls = count_onednn_calls(monkeypatch)
        fast = set_fast_paths(model, onednn=True)(ids, mask, types).last_hidden_state
        assert len(calls) == 4 * config.num_hidden_layers + 1  # every layer's four products and the pooler
        torch.testing.assert_close(fast, plain, atol=ATOL, rtol=0)
        calls.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast picks its own kernels
            model(ids, mask, types)
        model.double()(ids, mask, types)  # float64: not a float32 kernel
        assert calls == []
        monkeypatch.setattr(kernels, "ONEDNN_MIN_MACS", 1 << 22)  # the default: tiny products stay on F.linear
        model.float()(ids, mask, types)
        assert calls == []


def test_fused_qkv_keeps_transformers_tensor_names_and_round_trips(tmp_path):
    config = tiny_config()
    torch.manual_seed(2)
    model = BertModel(config)
    state = model.state_dict()
    assert {"layers.0.attn.query.weight", "layers.0.attn.key.bias", "layers.0.attn.value.weight"} <= set(state)
    assert not any("qkv" in k for k in state)
    assert state["layers.0.attn.key.weight"].shape == (config.hidden_size, config.hidden_size)
    # The three blocks are the rows of the fused weight, in query, key, value order.
    H = config.hidden_size
    torch.testing.assert_close(state["layers.1.attn.value.weight"], model.layers[1].attn.qkv.weight[2 * H:])
    other = BertModel(config)
    other.load_state_dict(state)
    for (n, p), q in zip(model.named_parameters(), other.parameters()):
        assert torch.equal(p, q), n
    model.save_pretrained(tmp_path)
    assert torch.equal(BertModel.from_pretrained(tmp_path).layers[0].attn.qkv.weight, model.layers[0].attn.qkv.weight)


def test_unpadded_bare_encoder_and_task_heads_match_plain_path():
    config = tiny_config()
    batch = padded_batch(config, lengths=(5, 12, 9))
    ids, mask, types = batch[:3]
    real = mask.bool()
    torch.manual_seed(3)
    for cls in (BertModel, BertForSequenceClassification, BertForTokenClassification, BertForQuestionAnswering):
        model = cls(config).eval()
        with torch.no_grad():
            fast = model(ids, mask, types)
            plain = set_fast_paths(model, unpad=False)(ids, mask, types)
        if cls is BertModel:
            torch.testing.assert_close(fast.last_hidden_state[real], plain.last_hidden_state[real], atol=ATOL, rtol=0)
            torch.testing.assert_close(fast.pooler_output, plain.pooler_output, atol=ATOL, rtol=0)
        elif cls is BertForSequenceClassification:
            torch.testing.assert_close(fast.logits, plain.logits, atol=ATOL, rtol=0)
        else:
            torch.testing.assert_close(fast.logits[real], plain.logits[real], atol=ATOL, rtol=0)


def test_unpadded_causal_model_matches_plain_path():
    config = tiny_config(**NO_DROPOUT, causal=True)
    torch.manual_seed(4)
    model = BertForCausalLM(config)
    ids, mask, *_ = padded_batch(config)
    labels = ids.masked_fill(mask == 0, IGNORE_INDEX)
    fast = model(ids, mask, labels=labels)
    fast.loss.backward()
    fast_grads = grads(model)
    model.zero_grad(set_to_none=True)
    plain = set_fast_paths(model, unpad=False)(ids, mask, labels=labels)
    plain.loss.backward()
    torch.testing.assert_close(fast.loss, plain.loss, atol=ATOL, rtol=0)
    assert_same_grads(fast_grads, grads(model))


def test_a_packed_row_computes_each_document_as_if_alone():
    """Documents packed into one row (attention mask 1, 1, 1, 2, 2, 0) give, token for token, the outputs of the
    same documents in rows of their own: no attention across documents, positions restarting, on both paths."""
    config = tiny_config()
    torch.manual_seed(5)
    model = BertModel(config).eval()
    g = torch.Generator().manual_seed(5)
    docs = [torch.randint(5, config.vocab_size, (n,), generator=g) for n in (4, 6, 3, 7)]
    # Two packed rows: [doc0 doc1 pad pad] and [doc2 doc3]; T = 12.
    T = 12
    ids = torch.zeros(2, T, dtype=torch.long)
    mask = torch.zeros(2, T, dtype=torch.long)
    ids[0, :10] = torch.cat(docs[:2])
    mask[0, :4], mask[0, 4:10] = 1, 2
    ids[1, :10] = torch.cat(docs[2:])
    mask[1, :3], mask[1, 3:10] = 1, 2
    alone_ids = torch.zeros(4, T, dtype=torch.long)
    alone_mask = torch.zeros(4, T, dtype=torch.long)
    for i, d in enumerate(docs):
        alone_ids[i, :len(d)] = d
        alone_mask[i, :len(d)] = 1
    with torch.no_grad():
        alone = set_fast_paths(model, unpad=False)(alone_ids, alone_mask).last_hidden_state
        expected = [alone[i, :len(d)] for i, d in enumerate(docs)]
        for unpad in (True, False):
            packed = set_fast_paths(model, unpad=unpad)(ids, mask).last_hidden_state
            got = [packed[0, :4], packed[0, 4:10], packed[1, :3], packed[1, 3:10]]
            for a, b in zip(got, expected):
                torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


def test_unpadded_layout_groups_tokens_by_sequence():
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 2, 2, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]])
    tokens = Unpadded(mask, packed=True, causal=False)
    assert tokens.index.tolist() == [0, 1, 2, 5, 6, 7, 8, 10, 15, 16, 17, 18, 19]
    assert tokens.cu_seqlens.tolist() == [0, 3, 5, 7, 8, 13] and tokens.cu_seqlens.dtype == torch.int32
    assert tokens.max_len == 5 and tokens.num_sequences == 5
    # Attention groups: sequences by decreasing length (5, 3, 2, 2, 1) cut into 4 groups of equal count
    # ([5, 3], [2], [2], [1]), each laid out as (S_g, L_g) in one buffer: rows 0-9, 10-11, 12-13, 14.
    assert [(S_g, L_g) for S_g, L_g, _ in tokens.layout] == [(2, 5), (1, 2), (1, 2), (1, 1)]
    assert tokens.total == 15 and tokens.empty.tolist() == [8, 9]  # the 3-token sequence in a 5-wide group
    assert tokens.slot.tolist() == [5, 6, 7, 10, 11, 12, 13, 14, 0, 1, 2, 3, 4]
    x = torch.arange(13.0)[:, None]
    assert tokens.pad(x)[:, :, 0].tolist() == [[0, 1, 2, 0, 0], [3, 4, 5, 6, 0], [7, 0, 0, 0, 0],
                                                [8, 9, 10, 11, 12]]
    assert tokens.rows(torch.tensor([3, 6, 8, 9])).tolist() == [-1, 4, 6, -1]
    rows = torch.randn(13, 3, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda r: layouts.FillSlots.apply(r, tokens.slot, 15, tokens.empty), (rows,))
    laid_out = torch.randn(15, 3, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda x: layouts.ReadSlots.apply(x, tokens.slot), (laid_out,))


def test_attention_groups_leave_padding_rows_zeroed_and_unused():
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    tokens = Unpadded(mask, packed=False, causal=False)
    assert [(S_g, L_g) for S_g, L_g, _ in tokens.layout] == [(1, 4), (1, 3), (1, 2)]
    assert tokens.empty.numel() == 0  # one sequence per group: nothing to pad
    Unpadded.groups = 2
    try:
        grouped = Unpadded(mask, packed=False, causal=False)
    finally:
        Unpadded.groups = 4
    assert [(S_g, L_g) for S_g, L_g, _ in grouped.layout] == [(2, 4), (1, 2)]
    assert grouped.empty.tolist() == [7]  # the 3-token sequence in the 4-wide group: its last place
    laid = layouts.FillSlots.apply(torch.ones(9, 2), grouped.slot, grouped.total, grouped.empty)
    assert laid[:, 0].tolist() == [1, 1, 1, 1, 1, 1, 1, 0, 1, 1]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("packed", [False, True])
def test_attention_per_sequence_equals_the_length_groups(causal, packed):
    """The CPU inference path (one SDPA call per sequence, no mask) and the length groups (masked, padded to each
    group's longest) give the same contexts and the same gradient of qkv, causal or not, packed rows or not; an
    empty batch gives an empty context."""
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 2, 2, 2, 2], [1, 0, 0, 0, 0, 0, 0],
                         [1, 1, 1, 1, 1, 1, 1]])
    tokens = Unpadded(mask if packed else mask.clamp(max=1), packed=packed, causal=causal)
    qkv = torch.randn(tokens.index.numel(), 3 * 8, generator=g, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(tokens.index.numel(), 8, generator=g, dtype=torch.float64)
    each = tokens.attend_each(qkv, 2, 0.0)
    (each_grad,) = torch.autograd.grad(each, qkv, grad)
    groups = tokens.attend_groups(qkv, 2, 0.0)
    (groups_grad,) = torch.autograd.grad(groups, qkv, grad)
    torch.testing.assert_close(each, groups, atol=1e-12, rtol=0)
    torch.testing.assert_close(each_grad, groups_grad, atol=1e-12, rtol=0)
    with torch.no_grad():  # on a CPU, inference takes the per-sequence path; training the groups
        assert tokens.attend(qkv, 2, 0.0).equal(each)
    assert tokens.attend(qkv, 2, 0.0).equal(groups)
    empty = Unpadded(torch.zeros(2, 3, dtype=torch.long), packed=False, causal=causal)
    assert empty.attend_each(torch.zeros(0, 24), 2, 0.0).shape == (0, 8)


def test_flash_attention_varlen_call_convention(monkeypatch):
    """The FlashAttention branch (GPU + flash_attn) gets what flash_attn_varlen_func expects: (N, A, D) tensors,
    int32 cumulative lengths and the longest length. A reference kernel with that signature stands in for it."""
    calls = []

    def reference(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=0.0, causal=False):
        calls.append((q.shape, cu_q.dtype, max_q))
        out = torch.empty_like(q)
        for s in range(cu_q.numel() - 1):
            a, b = int(cu_q[s]), int(cu_q[s + 1])
            assert b - a <= max_q
            qs, ks, vs = (t[a:b].transpose(0, 1) for t in (q, k, v))  # (A, n, D)
            out[a:b] = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal).transpose(0, 1)
        return out

    config = tiny_config()
    torch.manual_seed(6)
    model = BertModel(config).eval()
    ids, mask, types, *_ = padded_batch(config)
    with torch.no_grad():
        expected = model(ids, mask, types).last_hidden_state
        monkeypatch.setattr(layouts, "flash_attn_varlen", reference)
        monkeypatch.setattr(layouts, "use_flash_attn", lambda q: True)
        got = model(ids, mask, types).last_hidden_state
    assert calls and calls[0][0] == (int(mask.sum()), config.num_attention_heads,
                                      config.hidden_size // config.num_attention_heads)
    assert calls[0][1] == torch.int32 and calls[0][2] == 12
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


def torch_varlen_reference(calls: list):
    """A stand-in with the signature of PyTorch's `varlen_attn`: (N, A, D) tensors, int32 offsets, the longest
    length, and window_size (left, right) with -1 for no limit, computed per sequence with SDPA."""
    def kernel(q, k, v, cu_q, cu_k, max_q, max_k, *, window_size=(-1, -1)):
        calls.append((q.shape, cu_q.dtype, max_q, window_size))
        left, right = window_size
        out = torch.empty_like(q)
        for s in range(cu_q.numel() - 1):
            a, b = int(cu_q[s]), int(cu_q[s + 1])
            assert b - a <= max_q
            i = torch.arange(b - a)
            offset = i[None, :] - i[:, None]  # key minus query position
            allowed = ((offset >= -left) | (left < 0)) & ((offset <= right) | (right < 0))
            qs, ks, vs = (t[a:b].transpose(0, 1) for t in (q, k, v))  # (A, n, D)
            out[a:b] = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=allowed).transpose(0, 1)
        return out
    return kernel


@pytest.mark.parametrize("causal", [False, True])
def test_torch_varlen_kernel_takes_attention_without_dropout(monkeypatch, causal):
    """Without the flash_attn package, PyTorch's own varlen FlashAttention runs the unpadded attention on a GPU
    when there is no attention dropout (inference; training with dropout 0), bidirectional or causal (window
    (-1, 0)); with dropout the SDPA path stays. A reference kernel with its signature stands in for it."""
    calls = []
    config = tiny_config(causal=causal, hidden_size=32, num_attention_heads=4)
    torch.manual_seed(7)
    model = BertModel(config).eval()
    ids, mask, types, *_ = padded_batch(config)
    with torch.no_grad():
        expected = model(ids, mask, types).last_hidden_state
        monkeypatch.setattr(layouts, "flash_attn_varlen", None)
        monkeypatch.setattr(layouts, "torch_varlen", torch_varlen_reference(calls))
        monkeypatch.setattr(layouts, "use_flash_attn", lambda q: True)
        got = model(ids, mask, types).last_hidden_state
    assert len(calls) == config.num_hidden_layers
    assert calls[0] == ((int(mask.sum()), 4, 8), torch.int32, 12, (-1, 0) if causal else (-1, -1))
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], atol=ATOL, rtol=0)
    calls.clear()
    model.train()  # attention dropout 0.1 in the tiny config: the kernel has no dropout, SDPA runs
    assert config.attention_probs_dropout_prob > 0
    model(ids, mask, types)
    assert calls == []


def test_predicting_at_padding_is_refused():
    config = tiny_config()
    model = BertForPreTraining(config)
    ids, mask, types, labels, _ = padded_batch(config)
    at = labels != IGNORE_INDEX
    at[2, -1] = True  # row 2 has 3 real tokens
    with pytest.raises(ValueError, match="predict_at selects padding"):
        model(ids, mask, types, predict_at=at)


def test_stream_isolates_packed_documents_in_the_attention_mask():
    special = SpecialIds(cls=1, sep=2, pad=0, mask=3)

    class Docs:
        sizes = [[5, 4], [3], [6, 2], [4]]

        def __len__(self):
            return len(self.sizes)

        def document(self, i):
            ids = [np.arange(10 + 10 * i, 10 + 10 * i + n) for n in self.sizes[i]]
            return ids, [np.ones(n, dtype=bool) for n in self.sizes[i]]

    options = StreamOptions(instances="full-sentences", max_seq_length=16, isolate_documents=True)
    stream = PretrainingStream(Docs(), options, special, vocab_size=60, micro_batch_size=2, prefetch=0)
    batch = next(iter(stream))
    mask = batch["attention_mask"]
    for row in range(mask.shape[0]):
        values = mask[row][mask[row] != 0].tolist()
        assert values == sorted(values) and values[0] == 1  # documents numbered 1, 2, ... in row order
        n = int((mask[row] != 0).sum())
        assert int(mask[row, n:].abs().sum()) == 0  # padding stays 0
    assert int(mask.max()) >= 2  # some row holds more than one document
    with pytest.raises(ValueError, match="isolate_documents"):
        StreamOptions(instances="nsp", isolate_documents=True)


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_layers_match_eager_forward_and_backward(backend):
    """The compile switch: compiled encoder layers give the eager numbers, across batches of different shapes."""
    from bertkit.models import compile_layers

    config = tiny_config(**NO_DROPOUT)
    torch.manual_seed(7)
    eager = BertForPreTraining(config).train()
    compiled = BertForPreTraining(config).train()
    compiled.load_state_dict(eager.state_dict())
    compile_layers(compiled, backend=backend)
    for lengths in ((12, 7, 3, 10), (5, 12, 12, 2)):  # a second token count: no stale shapes
        batch = padded_batch(config, lengths)
        a, ga = run_pretraining(eager, batch, sparse=True)
        b, gb = run_pretraining(compiled, batch, sparse=True)
        torch.testing.assert_close(b.loss, a.loss, atol=ATOL, rtol=0)
        assert_same_grads({k.replace("._orig_mod", ""): v for k, v in gb.items()}, ga)


def test_bf16_autocast_training_follows_the_fp32_loss_curve(tmp_path):
    """The trainer's bf16 switch: 200 steps of a tiny MLM on padded, variable-length batches under CPU autocast
    follow the fp32 run's loss curve within bf16 noise (smoothed over 20 steps), and both learn."""
    import json

    from bertkit.training.objectives import MaskedLMObjective
    from bertkit.training.trainer import TrainConfig, train

    config = tiny_config(**NO_DROPOUT)
    g = torch.Generator().manual_seed(8)
    batches = []
    for _ in range(8):  # counting sequences (each token predicts its neighbours) with padding
        lengths = tuple(int(n) for n in torch.randint(6, 17, (8,), generator=g))
        ids, mask, types, _, _ = padded_batch(config, lengths, T=16, seed=int(torch.randint(0, 10**6, (1,), generator=g)))
        start = torch.randint(5, 60, (8, 1), generator=g)
        ids = torch.where(mask.bool(), 5 + (start + torch.arange(16)) % (config.vocab_size - 5), ids)
        picked = (torch.rand(8, 16, generator=g) < 0.15) & mask.bool()
        picked[:, 2] = True
        batches.append({"input_ids": ids.masked_fill(picked, 4), "attention_mask": mask, "token_type_ids": types,
                        "labels": torch.where(picked, ids, torch.full_like(ids, IGNORE_INDEX))})

    class Cycle:
        def __iter__(self):
            while True:
                yield from batches

        def load_state_dict(self, state):  # pragma: no cover - not resumed here
            raise AssertionError("not resumable")

    curves = {}
    for precision in ("fp32", "bf16"):
        torch.manual_seed(9)
        model = BertForMaskedLM(config)
        train_config = TrainConfig(max_steps=200, warmup_steps=10, learning_rate=2e-3, progress=False, device="cpu",
                                   precision=precision, log_every=1, save_every=1000, max_grad_norm=1.0)
        train(model, MaskedLMObjective(pair_task=None), Cycle(), train_config, tmp_path / precision)
        lines = (tmp_path / precision / "metrics.jsonl").read_text().splitlines()
        curves[precision] = torch.tensor([json.loads(line)["mlm_loss"] for line in lines if '"mlm_loss"' in line])
    fp32, bf16 = curves["fp32"], curves["bf16"]
    assert len(fp32) == len(bf16) == 200
    smooth = lambda c: c.unfold(0, 20, 20).mean(1)  # noqa: E731 - means of 10 windows of 20 steps
    assert float(smooth(fp32)[-1]) < 0.7 * float(smooth(fp32)[0])  # it learns
    assert float((smooth(bf16) - smooth(fp32)).abs().max()) < 0.02 * float(smooth(fp32)[0])  # measured: 0.002
