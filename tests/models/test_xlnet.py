"""XLNet (bertkit.models.xlnet): the same numbers as transformers' XLNet on the same weights, with a permutation
mask and target mapping, memories from a previous segment, token types and left-padded batches; directories both
ways (no missing or unexpected keys); bi_data and clamp_len; strict refusal of what bertkit does not build."""

import json

import pytest
import torch

from bertkit.checkpoint import CheckpointError
from bertkit.config import XLNetConfig
from bertkit.models import (XLNetForMultipleChoice, XLNetForQuestionAnswering, XLNetForSequenceClassification,
                            XLNetForTokenClassification, XLNetLMHeadModel, XLNetModel)
from bertkit.models.xlnet import relative_shift

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=99, d_model=32, n_layer=2, n_head=4, d_inner=37, mem_len=7, reuse_len=5)
ATOL = RTOL = 1e-5
PAIRS = {XLNetModel: "XLNetModel", XLNetLMHeadModel: "XLNetLMHeadModel",
         XLNetForSequenceClassification: "XLNetForSequenceClassification",
         XLNetForTokenClassification: "XLNetForTokenClassification",
         XLNetForMultipleChoice: "XLNetForMultipleChoice", XLNetForQuestionAnswering: "XLNetForQuestionAnsweringSimple"}


def hf_model(name: str, seed: int = 0, **overrides):
    """A transformers XLNet with random weights (LayerNorms away from 1, the LM bias away from 0), no dropout."""
    torch.manual_seed(seed)
    config = transformers.XLNetConfig(**{**TINY, "dropout": 0.0, "summary_last_dropout": 0.0, "num_labels": 3,
                                         **overrides})
    model = getattr(transformers, name)(config)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "layer_norm" in pname or pname.endswith(".bias"):
                p.add_(0.2 * torch.randn(p.shape))
    return model.eval()


def inputs(seed: int = 0, B: int = 4, T: int = 10, P: int = 4):
    """ids, left-padded attention mask (rows 1 and 3), token types 0/1 and <cls>'s 2, a random permutation mask and
    a target mapping with a zero row (row 0 predicts P - 1 tokens)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(6, TINY["vocab_size"], (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, :3] = 0
    mask[3, :1] = 0
    ids[mask == 0] = 5
    types = torch.zeros(B, T, dtype=torch.long)
    types[:, T // 2:] = 1
    types[:, -1] = 2
    perm = (torch.rand(B, T, T, generator=g) > 0.5).float()
    mapping = torch.zeros(B, P, T)
    for b in range(B):
        for p, t in enumerate(torch.randperm(T, generator=g)[:P].tolist()):
            if not (b == 0 and p == P - 1):
                mapping[b, p, t] = 1.0
    return ids, mask, types, perm, mapping


def load_ours(hf, cls, tmp_path):
    hf.save_pretrained(tmp_path)
    return cls.from_pretrained(tmp_path).eval()


def test_relative_shift_moves_row_i_left_by_t_minus_i():
    B, N, T, K = 1, 1, 3, 5
    scores = torch.arange(T * (K + T), dtype=torch.float).view(B, N, T, K + T)
    shifted = relative_shift(scores, K)
    for i in range(T):
        for j in range(K):
            assert shifted[0, 0, i, j] == scores[0, 0, i, j + T - i]


@pytest.mark.parametrize("cls", [XLNetModel, XLNetLMHeadModel])
def test_two_streams_with_memory_equal_transformers(cls, tmp_path):
    hf = hf_model(PAIRS[cls])
    ours = load_ours(hf, cls, tmp_path)
    ids, mask, types, perm, mapping = inputs()
    ids2 = inputs(seed=1)[0]
    with torch.no_grad():
        first_hf = hf(ids, attention_mask=mask, token_type_ids=types, use_mems=True)
        first = ours(ids, mask, types, use_mems=True)
        for theirs, mine in zip(first_hf.mems, first.mems):  # transformers' memories are (M, B, H)
            torch.testing.assert_close(mine, theirs.transpose(0, 1), atol=ATOL, rtol=RTOL)
        assert first.mems[0].shape[1] == TINY["reuse_len"]  # only the reused tokens are kept
        second_hf = hf(ids2, attention_mask=mask, token_type_ids=types, mems=first_hf.mems, perm_mask=perm,
                       target_mapping=mapping, use_mems=True)
        second = ours(ids2, mask, types, mems=first.mems, perm_mask=perm, target_mapping=mapping, use_mems=True)
    out = second.logits if cls is XLNetLMHeadModel else second.last_hidden_state
    assert out.shape[1] == mapping.shape[1]  # the query stream: one row per prediction
    torch.testing.assert_close(out, second_hf[0], atol=ATOL, rtol=RTOL)
    for theirs, mine in zip(second_hf.mems, second.mems):
        torch.testing.assert_close(mine, theirs.transpose(0, 1), atol=ATOL, rtol=RTOL)
    assert second.mems[0].shape[1] == TINY["mem_len"]  # old memory + reused tokens, the last mem_len kept


@pytest.mark.parametrize("extra", [dict(), dict(bi_data=True), dict(clamp_len=3)])
def test_content_stream_and_hidden_states_equal_transformers(extra, tmp_path):
    hf = hf_model("XLNetModel", seed=2, **extra)
    ours = load_ours(hf, XLNetModel, tmp_path)
    ids, mask, types, perm, _ = inputs(seed=3)
    with torch.no_grad():
        theirs = hf(ids, attention_mask=mask, token_type_ids=types, perm_mask=perm, output_hidden_states=True)
        mine = ours(ids, mask, types, perm_mask=perm, output_hidden_states=True)
        plain_theirs = hf(ids, attention_mask=mask)[0]
        plain = ours(ids, mask).last_hidden_state
    torch.testing.assert_close(mine.last_hidden_state, theirs.last_hidden_state, atol=ATOL, rtol=RTOL)
    assert len(mine.hidden_states) == len(theirs.hidden_states) == TINY["n_layer"] + 1
    for a, b in zip(mine.hidden_states, theirs.hidden_states):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(plain, plain_theirs, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("cls", [XLNetForSequenceClassification, XLNetForTokenClassification,
                                 XLNetForQuestionAnswering])
def test_task_models_equal_transformers_on_left_padded_batches(cls, tmp_path):
    hf = hf_model(PAIRS[cls], seed=4, num_labels=3 if cls is not XLNetForQuestionAnswering else 2)
    ours = load_ours(hf, cls, tmp_path)
    ids, mask, types, _, _ = inputs(seed=5)
    with torch.no_grad():
        theirs = hf(ids, attention_mask=mask, token_type_ids=types).logits if cls is not XLNetForQuestionAnswering \
            else torch.stack(hf(ids, attention_mask=mask, token_type_ids=types)[:2], dim=-1)
        mine = ours(ids, mask, types).logits
    torch.testing.assert_close(mine, theirs, atol=ATOL, rtol=RTOL)


def test_multiple_choice_equals_transformers(tmp_path):
    hf = hf_model("XLNetForMultipleChoice", seed=6)
    ours = load_ours(hf, XLNetForMultipleChoice, tmp_path)
    ids, mask, types, _, _ = inputs(seed=7)
    ids, mask, types = (x.view(2, 2, -1) for x in (ids, mask, types))
    with torch.no_grad():
        theirs = hf(ids, attention_mask=mask, token_type_ids=types).logits
        mine = ours(ids, mask, types).logits
    torch.testing.assert_close(mine, theirs, atol=ATOL, rtol=RTOL)


def test_summary_reads_the_last_real_token_whichever_side_is_padded(tmp_path):
    """A right-padded row gives the logits of the same row padded on the left (XLNet's side)."""
    ours = load_ours(hf_model("XLNetForSequenceClassification", seed=8), XLNetForSequenceClassification, tmp_path)
    ids = torch.randint(6, 99, (1, 7))
    left = torch.cat([torch.full((1, 3), 5), ids], 1)
    right = torch.cat([ids, torch.full((1, 3), 5)], 1)
    mask_left = torch.tensor([[0] * 3 + [1] * 7])
    with torch.no_grad():
        a = ours(left, mask_left).logits
        b = ours(right, mask_left.flip(1)).logits
    torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("cls", [XLNetLMHeadModel, XLNetForSequenceClassification, XLNetForTokenClassification,
                                 XLNetForMultipleChoice, XLNetForQuestionAnswering])
def test_our_directories_load_in_transformers_strictly_with_equal_outputs(cls, tmp_path):
    torch.manual_seed(9)
    config = XLNetConfig(**TINY, dropout=0.0, summary_last_dropout=0.0)
    ours = (cls(config, num_labels=3) if cls in (XLNetForSequenceClassification, XLNetForTokenClassification)
            else cls(config)).eval()
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn(p.shape))
    ours.save_pretrained(tmp_path)
    name = json.loads((tmp_path / "config.json").read_text())["architectures"][0]
    assert name == PAIRS[cls]
    hf, info = getattr(transformers, name).from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    hf.eval()
    ids, mask, types, perm, mapping = inputs(seed=10)
    with torch.no_grad():
        if cls is XLNetLMHeadModel:
            theirs = hf(ids, attention_mask=mask, token_type_ids=types, perm_mask=perm, target_mapping=mapping)[0]
            mine = ours(ids, mask, types, perm_mask=perm, target_mapping=mapping).logits
        elif cls is XLNetForMultipleChoice:
            ids, mask, types = (x.view(2, 2, -1) for x in (ids, mask, types))
            theirs, mine = hf(ids, attention_mask=mask, token_type_ids=types)[0], ours(ids, mask, types).logits
        elif cls is XLNetForQuestionAnswering:
            theirs = torch.stack(hf(ids, attention_mask=mask, token_type_ids=types)[:2], dim=-1)
            mine = ours(ids, mask, types).logits
        else:
            theirs, mine = hf(ids, attention_mask=mask, token_type_ids=types)[0], ours(ids, mask, types).logits
    torch.testing.assert_close(mine, theirs, atol=ATOL, rtol=RTOL)


def test_an_encoder_directory_starts_fresh_heads_and_an_lm_directory_feeds_a_classifier(tmp_path):
    hf_model("XLNetLMHeadModel", seed=11).save_pretrained(tmp_path)
    lm = XLNetLMHeadModel.from_pretrained(tmp_path)
    classifier = XLNetForSequenceClassification.from_pretrained(tmp_path, num_labels=2)
    torch.testing.assert_close(classifier.encoder.word.weight, lm.encoder.word.weight)
    encoder = XLNetModel.from_pretrained(tmp_path)  # the LM bias is dropped for the bare encoder
    torch.testing.assert_close(encoder.mask_emb, lm.encoder.mask_emb)


@pytest.mark.parametrize("key, value", [("attn_type", "uni"), ("ff_activation", "softsign"),
                                        ("summary_type", "attn"), ("summary_type", "cls_index"),
                                        ("tie_word_embeddings", False), ("summary_proj_to_labels", True),
                                        ("mem_len", -3), ("d_head", 5), ("not_an_xlnet_key", 1)])
def test_unsupported_config_values_are_refused_naming_the_key(key, value, tmp_path):
    hf_model("XLNetModel").save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    data = json.loads(path.read_text())
    data[key] = value
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError) as err:
        XLNetModel.from_pretrained(tmp_path)
    assert key in str(err.value) and "config.json" in str(err.value)


def test_reuse_longer_than_memory_and_wrong_memories_are_refused():
    with pytest.raises(ValueError, match="reuse_len .* does not fit in mem_len"):
        XLNetConfig(**{**TINY, "reuse_len": 9, "mem_len": 4})
    model = XLNetModel(XLNetConfig(**TINY))
    ids = torch.randint(6, 99, (2, 5))
    with pytest.raises(ValueError, match="mems has 1 tensors"):
        model(ids, mems=[torch.zeros(2, 3, 32)])
    with pytest.raises(ValueError, match=r"mems\[1\] must be"):
        model(ids, mems=[torch.zeros(2, 3, 32), torch.zeros(3, 3, 32)])
    with pytest.raises(ValueError, match="perm_mask must be"):
        model(ids, perm_mask=torch.zeros(2, 4, 4))


def test_a_bert_directory_is_not_an_xlnet(tmp_path):
    from bertkit.models import BertModel
    from conftest import tiny_config

    BertModel(tiny_config()).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="cannot load"):
        XLNetModel.from_pretrained(tmp_path)


def test_predicted_positions_path_equals_the_general_target_mapping(tmp_path):
    """The query stream attending from the predicted positions only (one-hot rows) gives what transformers' linear
    map over every position gives, gradients included; a mapping that is not one-hot takes the general path."""
    hf = hf_model("XLNetLMHeadModel", seed=12)
    ours = load_ours(hf, XLNetLMHeadModel, tmp_path)
    ids, mask, types, perm, mapping = inputs(seed=13)
    fast = ours(ids, mask, types, perm_mask=perm, target_mapping=mapping).logits
    fast.square().sum().backward()
    grads = {n: p.grad.clone() for n, p in ours.named_parameters()}
    ours.zero_grad()
    ours.encoder.gather_targets = False
    slow = ours(ids, mask, types, perm_mask=perm, target_mapping=mapping).logits
    slow.square().sum().backward()
    torch.testing.assert_close(fast, slow, atol=ATOL, rtol=RTOL)
    for n, p in ours.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, atol=1e-5, rtol=1e-4)
    ours.encoder.gather_targets = True
    blurred = mapping * 0.5 + mapping.roll(1, dims=2) * 0.5  # not one-hot: the general path, as transformers
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, mask, types, perm_mask=perm, target_mapping=blurred).logits,
                                   hf(ids, attention_mask=mask, token_type_ids=types, perm_mask=perm,
                                      target_mapping=blurred).logits, atol=ATOL, rtol=RTOL)
