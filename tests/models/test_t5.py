"""T5 (bertkit.models.t5): the same numbers as transformers' T5 on the same weights, directories both ways (T5 1.0:
ReLU, tied output; T5 1.1: gated GELU, an lm_head of its own), the key/value cache, and generation token for token
(greedy and beam search) against transformers' `generate`."""

import json

import pytest
import torch

from bertkit.checkpoint import CheckpointError, WeightsMismatchError
from bertkit.config import IGNORE_INDEX, T5Config
from bertkit.models import BertModel, T5EncoderModel, T5ForConditionalGeneration
from bertkit.models.t5 import DecoderCache, RMSNorm, relative_position_bucket

transformers = pytest.importorskip("transformers")
from transformers.models.t5 import modeling_t5  # noqa: E402

# Few buckets and a short max_distance, so that sequences of 8-16 tokens reach the logarithmic buckets and the
# last one; three decoder layers in the 1.1 style, so that num_decoder_layers is exercised.
TINY = dict(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
            relative_attention_max_distance=12, decoder_start_token_id=0)
STYLES = {"t5-1.0": dict(feed_forward_proj="relu", tie_word_embeddings=True),
          "t5-1.1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False, num_decoder_layers=3)}
ATOL = RTOL = 1e-5


def hf_model(style: str, seed: int, encoder_only: bool = False, **overrides):
    """A transformers T5 of `style` with random weights: the norms away from 1 and, in the 1.1 style, an lm_head
    distinct from the embeddings (transformers builds it tied and only the weights untie it)."""
    torch.manual_seed(seed)
    config = transformers.T5Config(**{**TINY, **STYLES[style], "dropout_rate": 0.0, **overrides})
    model = (transformers.T5EncoderModel if encoder_only else transformers.T5ForConditionalGeneration)(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape))
        if not encoder_only and not STYLES[style]["tie_word_embeddings"]:
            model.lm_head.weight = torch.nn.Parameter(torch.randn(config.vocab_size, config.d_model))
    return model.eval()


def ours(style: str, seed: int, **overrides) -> T5ForConditionalGeneration:
    torch.manual_seed(seed)
    model = T5ForConditionalGeneration(T5Config(**{**TINY, **STYLES[style], "dropout_rate": 0.0, **overrides}))
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, RMSNorm):
                module.weight.copy_(1.0 + 0.2 * torch.randn(module.weight.shape))
    return model.eval()


def batch(seed: int = 0, B: int = 3, S: int = 14, T: int = 9):
    """Sources of different lengths: row 1 padded on the right, row 2 on the left; labels padded with IGNORE_INDEX
    (rows 0 and 1), ending with EOS (1)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, TINY["vocab_size"], (B, S), generator=g)
    mask = torch.ones(B, S, dtype=torch.long)
    mask[1, S - 5:] = 0
    mask[2, :4] = 0
    ids[mask == 0] = 0
    labels = torch.randint(2, TINY["vocab_size"], (B, T), generator=g)
    labels[0, 6], labels[0, 7:] = 1, IGNORE_INDEX
    labels[1, T - 1] = 1
    labels[2, 3], labels[2, 4:] = 1, IGNORE_INDEX
    return ids, mask, labels


# ---- blocks ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("buckets,max_distance", [(8, 12), (32, 128), (6, 20), (9, 7)])
def test_relative_position_bucket_matches_transformers(buckets, max_distance):
    relative = torch.arange(-300, 301)[None, :] - torch.arange(0, 3)[:, None]  # (3, 601)
    for bidirectional in (True, False):
        theirs = modeling_t5.T5Attention._relative_position_bucket(relative, bidirectional, buckets, max_distance)
        mine = relative_position_bucket(relative, bidirectional, buckets, max_distance)
        assert torch.equal(mine, theirs)
        # The far buckets are reached (an odd count leaves the last one to neither half of the encoder's).
        used = 2 * (buckets // 2) if bidirectional else buckets
        assert int(mine.max()) == used - 1 and int(mine.min()) == 0
    # Causal buckets: every key after the query falls in bucket 0; exact distances come first.
    assert relative_position_bucket(torch.tensor([3, 0, -1, -2]), False, 8, 12).tolist() == [0, 0, 1, 2]


def test_rms_norm_matches_transformers():
    x = torch.randn(2, 5, 32) * 3
    theirs, mine = modeling_t5.T5LayerNorm(32, eps=1e-6), RMSNorm(32, 1e-6)
    with torch.no_grad():
        theirs.weight.copy_(torch.randn(32))
        mine.weight.copy_(theirs.weight)
    assert torch.equal(mine(x), theirs(x))
    mine, theirs = mine.to(torch.bfloat16), theirs.to(torch.bfloat16)  # variance in float32, result in bf16
    assert mine(x.bfloat16()).dtype == torch.bfloat16
    assert torch.equal(mine(x.bfloat16()), theirs(x.bfloat16()))


# ---- checkpoints both ways ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("style", STYLES)
def test_transformers_directory_loads_with_equal_outputs(style, tmp_path):
    theirs = hf_model(style, seed=1)
    theirs.save_pretrained(tmp_path)
    model = T5ForConditionalGeneration.from_pretrained(tmp_path).eval()
    tied = STYLES[style]["tie_word_embeddings"]
    assert model.config.feed_forward_proj == STYLES[style]["feed_forward_proj"]
    assert model.config.tie_word_embeddings == tied and (model.lm_head is None) == tied
    assert model.config.scale_output == tied and model.config.decoder_layers == (3 if not tied else 2)
    ids, mask, labels = batch()
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask, labels=labels)
        got = model(ids, mask, labels=labels)
    torch.testing.assert_close(got.logits, expected.logits, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(got.encoder_last_hidden_state, expected.encoder_last_hidden_state, atol=ATOL,
                               rtol=RTOL)
    torch.testing.assert_close(got.loss, expected.loss, atol=ATOL, rtol=RTOL)
    # An encoder read from the full directory computes transformers' encoder output.
    encoder = T5EncoderModel.from_pretrained(tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(encoder(ids, mask).last_hidden_state, expected.encoder_last_hidden_state,
                                   atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("style", STYLES)
def test_transformers_encoder_directory_loads(style, tmp_path):
    theirs = hf_model(style, seed=2, encoder_only=True)
    theirs.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["is_encoder_decoder"] is False
    model = T5EncoderModel.from_pretrained(tmp_path)
    ids, mask, _ = batch(seed=3, S=16)
    with torch.no_grad():
        torch.testing.assert_close(model(ids, mask).last_hidden_state, theirs(input_ids=ids, attention_mask=mask)
                                   .last_hidden_state, atol=ATOL, rtol=RTOL)
    with pytest.raises(CheckpointError, match="is_encoder_decoder=false"):
        T5ForConditionalGeneration.from_pretrained(tmp_path)


@pytest.mark.parametrize("style", STYLES)
def test_bertkit_directory_loads_in_transformers(style, tmp_path):
    model = ours(style, seed=4)
    model.save_pretrained(tmp_path / "seq2seq")
    theirs, info = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "seq2seq",
                                                                            output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert theirs.config.scale_decoder_outputs == model.config.scale_output
    ids, mask, labels = batch(seed=5, S=16, T=12)
    with torch.no_grad():
        expected = theirs.eval()(input_ids=ids, attention_mask=mask, labels=labels)
        got = model(ids, mask, labels=labels)
    torch.testing.assert_close(got.logits, expected.logits, atol=ATOL, rtol=RTOL)
    # Back into bertkit: the same tensors and config.
    again = T5ForConditionalGeneration.from_pretrained(tmp_path / "seq2seq")
    assert again.config == model.config
    assert again.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(again.state_dict()[k], v) for k, v in model.state_dict().items())
    # The encoder alone.
    encoder = T5EncoderModel.from_pretrained(tmp_path / "seq2seq")
    encoder.save_pretrained(tmp_path / "encoder")
    theirs_encoder, info = transformers.T5EncoderModel.from_pretrained(tmp_path / "encoder",
                                                                       output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        torch.testing.assert_close(theirs_encoder(input_ids=ids, attention_mask=mask).last_hidden_state,
                                   got.encoder_last_hidden_state, atol=ATOL, rtol=RTOL)


def test_stored_copy_of_a_tied_head(tmp_path):
    """A tied config with lm_head.weight stored anyway: dropped when it is the embeddings, else the model is untied
    (transformers' rule), keeping the output scaling of a tied config."""
    from safetensors.torch import load_file, save_file

    theirs = hf_model("t5-1.0", seed=6)
    theirs.save_pretrained(tmp_path)
    weights = load_file(str(tmp_path / "model.safetensors"))
    save_file({**weights, "lm_head.weight": weights["shared.weight"].clone()}, str(tmp_path / "model.safetensors"))
    assert T5ForConditionalGeneration.from_pretrained(tmp_path).lm_head is None
    save_file({**weights, "lm_head.weight": torch.randn(100, 32)}, str(tmp_path / "model.safetensors"))
    model = T5ForConditionalGeneration.from_pretrained(tmp_path)
    assert model.lm_head is not None and model.config.scale_output
    theirs = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path).eval()
    ids, mask, labels = batch(seed=7)
    with torch.no_grad():
        torch.testing.assert_close(model(ids, mask, labels=labels).logits,
                                   theirs(input_ids=ids, attention_mask=mask, labels=labels).logits,
                                   atol=ATOL, rtol=RTOL)


def rewrite_config(directory, **changes):
    path = directory / "config.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_strict_loading_names_what_is_wrong(tmp_path):
    model = ours("t5-1.1", seed=8)
    model.save_pretrained(tmp_path)
    cases = {"feed_forward_proj": dict(feed_forward_proj="gated-silu", dense_act_fn="silu"),
             "unknown config keys": dict(relative_attention_mode="fancy"),
             "dense_act_fn": dict(dense_act_fn="relu"),
             "is_decoder": dict(is_decoder=True)}
    original = (tmp_path / "config.json").read_text()
    for needle, changes in cases.items():
        rewrite_config(tmp_path, **changes)
        with pytest.raises(ValueError, match=needle):
            T5ForConditionalGeneration.from_pretrained(tmp_path)
        (tmp_path / "config.json").write_text(original)
    rewrite_config(tmp_path, is_encoder_decoder=False)
    with pytest.raises(CheckpointError, match="is_encoder_decoder=false"):
        T5ForConditionalGeneration.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="is_encoder_decoder"):
        T5ForConditionalGeneration(T5Config(**TINY, is_encoder_decoder=False))
    (tmp_path / "config.json").write_text(original)
    with pytest.raises(CheckpointError, match="cannot load"):
        BertModel.from_pretrained(tmp_path)
    from safetensors.torch import load_file, save_file

    weights = load_file(str(tmp_path / "model.safetensors"))
    save_file({**weights, "encoder.block.0.layer.0.SelfAttention.rotary.weight": torch.zeros(2)},
              str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="SelfAttention.rotary.weight"):
        T5ForConditionalGeneration.from_pretrained(tmp_path)
    save_file({k: v for k, v in weights.items() if k != "lm_head.weight"}, str(tmp_path / "model.safetensors"))
    with pytest.raises(WeightsMismatchError, match="lm_head.weight"):
        T5ForConditionalGeneration.from_pretrained(tmp_path)


def test_bert_directory_refused_by_t5(tmp_path):
    from conftest import tiny_config

    BertModel(tiny_config()).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="T5ForConditionalGeneration cannot load"):
        T5ForConditionalGeneration.from_pretrained(tmp_path)


def test_config_json_round_trip():
    config = T5Config(**TINY, feed_forward_proj="gated-gelu", tie_word_embeddings=False, num_decoder_layers=3)
    data = config.to_dict()
    assert data["num_decoder_layers"] == 3 and data["dense_act_fn"] == "gelu_new" and data["is_gated_act"]
    assert "scale_decoder_outputs" not in data  # T5's rule (unscaled when untied) needs no key
    assert T5Config.from_dict(data) == config
    theirs = transformers.T5Config(**{k: v for k, v in data.items() if k != "model_type"})
    assert theirs.dense_act_fn == "gelu_new" and theirs.is_gated_act and theirs.num_decoder_layers == 3
    with pytest.raises(ValueError, match="relative_attention_max_distance"):
        T5Config(relative_attention_num_buckets=32, relative_attention_max_distance=16)


# ---- the model ----------------------------------------------------------------------------------------------------
def test_shift_right_and_loss():
    model = ours("t5-1.0", seed=9)
    labels = torch.tensor([[5, 6, 1, IGNORE_INDEX], [7, 8, 9, 1]])
    assert model.shift_right(labels).tolist() == [[0, 5, 6, 1], [0, 7, 8, 9]]
    ids = torch.randint(2, 100, (2, 7))
    out = model(ids, labels=labels)
    keep = labels != IGNORE_INDEX
    manual = -out.logits.log_softmax(-1)[keep].gather(1, labels[keep][:, None]).mean()
    torch.testing.assert_close(out.loss, manual)
    assert out.logits.shape == (2, 4, 100)


@pytest.mark.parametrize("style", STYLES)
def test_cached_decoding_matches_full_forward(style):
    model = ours(style, seed=10)
    ids, mask, labels = batch(seed=11)
    decoder_ids = model.shift_right(labels)
    with torch.no_grad():
        full = model(ids, mask, decoder_input_ids=decoder_ids).logits  # (B, T, V)
        memory = model.encode(ids, mask)
        cache = DecoderCache(len(model.decoder.layers))
        steps, cross = [], None
        for t in range(decoder_ids.shape[1]):
            steps.append(model.decode(decoder_ids[:, t:t + 1], memory, mask, cache=cache))
            assert cache.length == t + 1 and cache.self_kv[1][0].shape[2] == t + 1  # self-attention grows
            if cross is None:
                cross = cache.cross_kv[0][0]
            assert cache.cross_kv[0][0] is cross  # cross-attention's keys: projected once, reused
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=ATOL, rtol=RTOL)


def test_training_reaches_every_parameter_and_lowers_the_loss():
    model = ours("t5-1.1", seed=12, dropout_rate=0.1).train()
    ids, mask, labels = batch(seed=13)
    model(ids, mask, labels=labels).loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name  # position bias tables included
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(15):
        optimizer.zero_grad()
        loss = model(ids, mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_dropout_only_in_training():
    model = ours("t5-1.0", seed=14, dropout_rate=0.3)
    ids, mask, labels = batch(seed=15)
    with torch.no_grad():
        model.eval()
        a, b = model(ids, mask, labels=labels).logits, model(ids, mask, labels=labels).logits
        model.train()
        c, d = model(ids, mask, labels=labels).logits, model(ids, mask, labels=labels).logits
    assert torch.equal(a, b) and not torch.allclose(c, d)
    assert T5EncoderModel(model.config).num_parameters() < model.num_parameters()


def test_initialisation_is_t5s():
    config = T5Config(vocab_size=400, d_model=128, d_kv=32, d_ff=512, num_layers=1, num_heads=4)
    model = T5ForConditionalGeneration(config)
    attn = model.encoder.layers[0].attn
    assert attn.query.weight.std().item() == pytest.approx((128 * 32) ** -0.5, rel=0.1)
    assert attn.key.weight.std().item() == pytest.approx(128 ** -0.5, rel=0.1)
    assert model.encoder.layers[0].ffn.down.weight.std().item() == pytest.approx(512 ** -0.5, rel=0.1)
    assert model.shared.weight.std().item() == pytest.approx(1.0, rel=0.1)
    assert torch.equal(model.decoder.final_norm.weight, torch.ones(128))
    assert all(not hasattr(m, "bias") or m.bias is None for m in model.modules() if isinstance(m, torch.nn.Linear))


# ---- generation ---------------------------------------------------------------------------------------------------
def generation_pair(style: str, seed: int, tmp_path, factor: float, eos_scale: float):
    """transformers' model and ours on the same weights, made to generate interesting sequences: larger initial
    weights (`factor`: more varied tokens) and a louder EOS row (`eos_scale`: rows end at different lengths)."""
    # As many decoder layers as encoder layers: transformers 5's generate sizes its cache by the encoder's count.
    theirs = hf_model(style, seed, initializer_factor=factor, num_decoder_layers=TINY["num_layers"])
    with torch.no_grad():
        theirs.lm_head.weight[1] *= eos_scale
    theirs.save_pretrained(tmp_path / f"{style}-{seed}")
    return theirs, T5ForConditionalGeneration.from_pretrained(tmp_path / f"{style}-{seed}").eval()


def sources(seed: int, B: int = 6):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, 100, (B, 10), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, :3] = 0
    return ids.masked_fill(mask == 0, 0), mask


def after_eos(sequences: torch.Tensor, fill: int) -> torch.Tensor:
    """Every position after a row's first EOS set to `fill` (transformers' beam search fills with EOS there)."""
    eos = (sequences == 1).int()
    seen = (eos.cumsum(1) - eos) > 0
    return sequences.masked_fill(seen, fill)


@pytest.mark.parametrize("style", STYLES)
def test_greedy_matches_transformers(style, tmp_path):
    ended = []
    for seed in range(3):
        theirs, model = generation_pair(style, seed, tmp_path, factor=3.0, eos_scale=2.0)
        ids, mask = sources(seed)
        expected = theirs.generate(input_ids=ids, attention_mask=mask, do_sample=False, num_beams=1,
                                   max_new_tokens=12)
        got = model.generate(ids, mask, max_new_tokens=12)
        assert torch.equal(got, expected)
        ended.append(bool((got == 1).any()))
        assert torch.equal(after_eos(got, 0), got)  # rows that ended are padded
    assert any(ended)


@pytest.mark.parametrize("style", STYLES)
def test_beam_search_matches_transformers(style, tmp_path):
    outcomes = []
    for seed in range(3):
        # Many hypotheses ending at different lengths, so that the length penalty decides between them.
        theirs, model = generation_pair(style, seed, tmp_path, factor=1.0, eos_scale=3.0)
        ids, mask = sources(seed, B=8)
        greedy = model.generate(ids, mask, max_new_tokens=12)
        for length_penalty, early_stopping in ((0.0, True), (0.5, True), (1.0, True), (2.0, True), (3.0, True),
                                               (0.5, False), (2.0, False)):
            expected = theirs.generate(input_ids=ids, attention_mask=mask, do_sample=False, num_beams=3,
                                       max_new_tokens=12, length_penalty=length_penalty,
                                       early_stopping=early_stopping)
            got = model.generate(ids, mask, max_new_tokens=12, num_beams=3, length_penalty=length_penalty,
                                 early_stopping=early_stopping)
            assert got.shape == expected.shape
            assert torch.equal(after_eos(got, 0), after_eos(expected, 0))
            assert torch.equal(after_eos(got, 0), got)  # ours pads with pad_token_id after EOS
            outcomes.append((length_penalty, got, greedy))
    # The comparison is not vacuous: beams differ from greedy, and the length penalty changes the result.
    assert any(g.shape != b.shape or not torch.equal(g, b) for _, b, g in outcomes)
    by_penalty = {}
    for lp, b, _ in outcomes:
        by_penalty.setdefault(lp, []).append(b)
    assert any(a.shape != b.shape or not torch.equal(a, b) for a, b in zip(by_penalty[0.0], by_penalty[3.0]))


def test_sampling():
    model = ours("t5-1.0", seed=16, initializer_factor=3.0)
    ids, mask = sources(17)

    def sample(seed, **kwargs):
        return model.generate(ids, mask, max_new_tokens=10, generator=torch.Generator().manual_seed(seed), **kwargs)

    assert torch.equal(sample(0, temperature=1.0), sample(0, temperature=1.0))
    assert not torch.equal(sample(0, temperature=2.0), sample(1, temperature=2.0))
    assert torch.equal(sample(0, temperature=1.0, top_k=1), model.generate(ids, mask, max_new_tokens=10))
    # With top_k=3 every sampled token is among the 3 best given what came before it.
    out = sample(2, temperature=5.0, top_k=3)
    with torch.no_grad():
        logits = model(ids, mask, decoder_input_ids=out[:, :-1]).logits  # (B, n, V)
    top3 = logits.topk(3, dim=-1).indices
    real = torch.ones_like(out[:, 1:], dtype=torch.bool)
    real[:, 1:] = (out[:, 1:-1] != 1) & (out[:, 1:-1] != 0)  # before a row's EOS (after it: padding)
    chosen = (top3 == out[:, 1:, None]).any(-1)
    assert bool(chosen[real].all())
    with pytest.raises(ValueError, match="num_beams"):
        model.generate(ids, mask, num_beams=2, temperature=1.0)
