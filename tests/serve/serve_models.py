"""Tiny model directories of every kind the server serves, inputs of varied lengths, and a tolerant comparison,
shared by the tests of bertkit.serve and bertkit.export."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import torch

from bertkit import BertConfig, BertForPreTraining, WordPieceTokenizer
from bertkit.config import ModernBertConfig
from bertkit.models import (BertForCausalLM, BertForMultipleChoice, BertForQuestionAnswering,
                            BertForSequenceClassification, BertForTokenClassification, ModernBertForMaskedLM,
                            ModernBertForMultipleChoice, ModernBertForQuestionAnswering,
                            ModernBertForSequenceClassification, ModernBertForTokenClassification)

WORDS = ("john mary peter anna lives in paris london berlin rome the movie was good bad very quite a story "
         "where does live nobody knows fox jumps over lazy dog and music fun long short").split()
LABELS = {"classify": ["neg", "neu", "pos"], "ner": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]}


def sentence(rng: random.Random, low: int = 1, high: int = 30) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def fixed_vocabulary() -> WordPieceTokenizer:
    """A WordPiece vocabulary written out, not trained, so that every test input's pieces are its words: the
    special tokens, every word of WORDS whole, each of their letters alone and as a ##suffix, and punctuation."""
    letters = sorted(set("".join(WORDS)))
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *".,?!'", *letters, *(f"##{c}" for c in letters),
              *WORDS]
    return WordPieceTokenizer({t: i for i, t in enumerate(dict.fromkeys(tokens))})  # "a" is a letter and a word


def build_models(root: Path, model_type: str = "bert") -> dict[str, Path]:
    """kind -> a model directory with random weights and a fixed WordPiece vocabulary: classify (3 labels,
    length 24), ner (5 BIO tags, 24), squad (v1.1, length 32, stride 8, question cut at 8), swag (24), a
    pretraining model (fill-mask and embeddings). model_type: a BERT family
    (`BertConfig.for_family`), "causal" (BERT with causal attention; BertForCausalLM in the pretraining model's
    place) or "modernbert"."""
    tokenizer = fixed_vocabulary()
    fields = dict(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=64, max_position_embeddings=64, initializer_range=0.2)
    classes = (BertForSequenceClassification, BertForTokenClassification, BertForQuestionAnswering,
               BertForMultipleChoice, BertForPreTraining)
    if model_type == "modernbert":  # 3 layers (global, sliding window of +-4 tokens, global), the tokenizer's ids
        config = ModernBertConfig(**{**fields, "num_hidden_layers": 3, "global_attn_every_n_layers": 2,
                                     "local_attention": 8, "global_rope_theta": 1000.0, "local_rope_theta": 50.0,
                                     "pad_token_id": tokenizer.pad_id, "cls_token_id": tokenizer.cls_id,
                                     "sep_token_id": tokenizer.sep_id, "bos_token_id": tokenizer.cls_id,
                                     "eos_token_id": tokenizer.sep_id})
        classes = (ModernBertForSequenceClassification, ModernBertForTokenClassification,
                   ModernBertForQuestionAnswering, ModernBertForMultipleChoice, ModernBertForMaskedLM)
    elif model_type == "causal":  # GPT-style: sentence heads read the last real token; the LM for fill-mask's place
        config = BertConfig(**fields, causal=True)
        classes = (*classes[:4], BertForCausalLM)
    else:
        if model_type == "roberta":
            fields.update(type_vocab_size=1, pad_token_id=1)
        if model_type in ("albert", "electra"):
            fields.update(embedding_size=16)
        config = BertConfig.for_family(model_type, **fields)
    sequence, token, qa, choice, pretraining = classes
    torch.manual_seed(0)
    infos = {
        "classify": (lambda: sequence(config, 3, LABELS["classify"]),
                     {"kind": "classify", "max_seq_length": 24, "regression": False}),
        "ner": (lambda: token(config, 5, LABELS["ner"]),
                {"kind": "ner", "max_seq_length": 24, "scheme": "bio"}),
        "squad": (lambda: qa(config),
                  {"kind": "squad", "max_seq_length": 32, "version_2": False, "null_threshold": 0.0, "doc_stride": 8,
                   "max_query_length": 8, "max_answer_length": 10, "n_best_size": 5}),
        "swag": (lambda: choice(config), {"kind": "swag", "max_seq_length": 24}),
        "pretraining": (lambda: pretraining(config), None),
    }
    out = {}
    for kind, (build, info) in infos.items():
        model = build()  # every family has every head (its own: bertkit.models.heads.SENTENCE_HEADS)
        path = root / f"{model_type}-{kind}"
        model.save_pretrained(path, tokenizer=tokenizer)
        if info is not None:
            (path / "finetune.json").write_text(json.dumps(info), encoding="utf-8")
        out[kind] = path
    return out


def causal_model(root: Path) -> Path:
    """A tiny causal model (BertForCausalLM, 40 positions) with random weights and the fixed WordPiece vocabulary."""
    tokenizer = fixed_vocabulary()
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=40, initializer_range=0.5, causal=True)
    torch.manual_seed(0)
    BertForCausalLM(config).save_pretrained(root / "causal", tokenizer=tokenizer)
    return root / "causal"


def t5_model(root: Path) -> Path:
    """A tiny T5 without a task (random weights that write different things for different inputs), Unigram."""
    from bertkit.config import T5Config
    from bertkit.models import T5ForConditionalGeneration
    from bertkit.tokenizers import UnigramTokenizer

    texts = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 3
    tokenizer = UnigramTokenizer.train(texts, vocab_size=100, show_progress=False, extra_ids=5)
    torch.manual_seed(1)
    config = T5Config.preset("tiny", vocab_size=tokenizer.vocab_size, initializer_factor=5.0, d_model=32, d_ff=64,
                             d_kv=16)
    T5ForConditionalGeneration(config).save_pretrained(root / "t5", tokenizer=tokenizer)
    return root / "t5"


def inputs_for(kind: str, n: int, seed: int, mask: str = "[MASK]") -> list[dict]:
    """n JSON inputs of `kind` with lengths from a few tokens to past the model's length (truncated ones too)."""
    rng = random.Random(seed)
    items = []
    for i in range(n):
        if kind == "classify":
            item = {"text": sentence(rng)}
            if i % 3 == 0:
                item["pair"] = sentence(rng, 1, 12)
        elif kind in ("ner", "embeddings"):
            item = {"text": sentence(rng)}
        elif kind == "squad":
            item = {"question": sentence(rng, 2, 12) + " ?", "context": sentence(rng, 3, 60) + " ."}
        elif kind == "swag":
            item = {"context": sentence(rng, 2, 10),
                    "choices": [sentence(rng, 1, 12) for _ in range(rng.randint(2, 4))]}
        else:
            words = sentence(rng, 2, 30).split()
            for _ in range(rng.randint(1, 2)):
                words.insert(rng.randrange(len(words) + 1), mask)
            item = {"text": " ".join(words)}
        items.append(item)
    return items


def as_predict_input(kind: str, item: dict):
    """The Python input `bertkit.tasks.finetune.predict` takes for a JSON input."""
    if kind == "classify":
        return item["text"] if item.get("pair") is None else (item["text"], item["pair"])
    if kind == "ner":
        return item["text"]
    if kind == "squad":
        return item["question"], item["context"]
    return item["context"], item["choices"]


def assert_same(got, want, path: str = "", tol: float = 1e-5) -> None:
    """Same JSON structure, equal strings, ints and bools, floats within tol (absolute, or relative for large)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), f"{path}: keys {sorted(got)} != {sorted(want)}"
        for k in want:
            assert_same(got[k], want[k], f"{path}.{k}", tol)
    elif isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), f"{path}: {got!r} != {want!r}"
        for i, (a, b) in enumerate(zip(got, want)):
            assert_same(a, b, f"{path}[{i}]", tol)
    elif isinstance(want, float) and not isinstance(want, bool):
        if math.isinf(want):
            assert got == ("inf" if want > 0 else "-inf"), f"{path}: {got!r} != {want!r}"
        else:
            assert isinstance(got, (int, float)) and abs(got - want) <= tol * max(1.0, abs(want)), \
                f"{path}: {got!r} != {want!r}"
    else:
        assert got == want, f"{path}: {got!r} != {want!r}"
