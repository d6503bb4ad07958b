"""The main job's evaluation (stage 7): fill-mask on held-out sentences by the masked word's frequency band,
beside the frequency baseline."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertkit.data.shards import ShardedCorpus
from bertkit.models import ModelDir

FILL_MASK_PROMPTS = 1000
FILL_MASK_EXAMPLES = 8
FREQUENT_WORDS = 100  # fill-mask accuracy is also given on words outside the corpus's 100 most frequent
# Fill-mask by the masked word's frequency rank in the training split: (name, first rank, rank past the last).
FREQUENCY_BANDS = (("top 100", 0, 100), ("100-1,000", 100, 1000), ("rarer", 1000, 1 << 62))


def fill_mask_evaluation(model_dir: str | os.PathLike, data_dir: str | os.PathLike, prompts: int = FILL_MASK_PROMPTS,
                         examples: int = FILL_MASK_EXAMPLES, top_k: int = 5, seed: int = 0,
                         frequent: int = FREQUENT_WORDS, batch_size: int = 64) -> dict[str, Any]:
    """Top-1 accuracy of masked-word prediction on held-out sentences whose masked word is known.

    From the prepared data's eval split (documents pretraining never saw), up to `prompts` sentences of 6 to 60
    pieces, at least 80% of them pieces of letters, are drawn with a seeded generator; in each, one word that is a
    single vocabulary piece of letters is replaced by [MASK] (chosen at random among such words), and the model
    sees the sentence alone. Also given:
    the accuracy of always answering the training split's most frequent such word (the unigram baseline), and the
    accuracy on prompts whose word is not among the training split's `frequent` most frequent words.

    Returns {"prompts", "top1_accuracy", "top5_accuracy", "baseline_word", "baseline_accuracy", "rare_prompts",
    "rare_top1_accuracy", "examples": [{"prompt", "answer", "candidates": [[token, probability], ...], "correct"}]}
    where the examples are the first `examples` prompts drawn (not chosen by outcome).
    """
    model_dir, data_dir = ModelDir.open(model_dir), Path(data_dir)
    tokenizer = model_dir.tokenizer()
    vocab = [tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]
    special = set(tokenizer.special_ids)
    maskable = np.array([i not in special and t.isalpha() and not t.startswith("##") for i, t in enumerate(vocab)])
    chosen = _draw_prompts(data_dir, vocab, maskable, prompts, seed)
    counts = _maskable_counts(data_dir, tokenizer.vocab_size, maskable)
    most_frequent = int(counts.argmax())
    common = set(np.argsort(-counts, kind="stable")[:frequent].tolist())
    top_ids, top_p = _predict(model_dir.load("pretraining").eval(), tokenizer, chosen, top_k, batch_size)

    answers = [int(ids[position]) for ids, position in chosen]
    correct = [found[0] == answer for found, answer in zip(top_ids, answers)]
    in_top5 = [answer in found for found, answer in zip(top_ids, answers)]
    rank = np.empty(tokenizer.vocab_size, dtype=np.int64)
    rank[np.argsort(-counts, kind="stable")] = np.arange(tokenizer.vocab_size)
    band_of = [next(k for k, (_, low, high) in enumerate(FREQUENCY_BANDS) if low <= rank[a] < high)
               for a in answers]

    def example(i: int) -> dict[str, Any]:
        ids, position = chosen[i]
        masked = ids.copy()
        masked[position] = tokenizer.mask_id
        return {"prompt": tokenizer.decode(masked.tolist(), skip_special_tokens=False),
                "answer": vocab[answers[i]], "correct": correct[i], "band": FREQUENCY_BANDS[band_of[i]][0],
                "candidates": [[vocab[t], round(q, 4)] for t, q in zip(top_ids[i], top_p[i])]}

    # The examples shown: the first prompts drawn from the middle band (words a unigram model does not already
    # get), then from the others when it has too few; not chosen by outcome.
    order = sorted(range(len(chosen)), key=lambda i: (band_of[i] != 1, i))
    n = len(chosen)
    rare = [i for i, answer in enumerate(answers) if answer not in common]
    return {"prompts": n, "top1_accuracy": sum(correct) / n, "top5_accuracy": sum(in_top5) / n,
            "baseline_word": vocab[most_frequent],
            "baseline_accuracy": sum(a == most_frequent for a in answers) / n,
            "rare_prompts": len(rare),
            "rare_top1_accuracy": (sum(correct[i] for i in rare) / len(rare)) if rare else None,
            "frequent_words": frequent, "bands": _band_scores(band_of, answers, correct, in_top5, counts),
            "examples": [example(i) for i in order[:examples]]}


def _draw_prompts(data_dir: Path, vocab: list[str], maskable: np.ndarray, prompts: int,
                  seed: int) -> list[tuple[np.ndarray, int]]:
    """Up to `prompts` (held-out sentence's piece ids, position of its masked word), drawn with
    `numpy.random.default_rng(seed)`: the sentences in a seeded order, in each one word of one `maskable` piece
    chosen at random; sentences without such a word are passed over. ValueError when none has one."""
    held_out = ShardedCorpus(data_dir, "eval")
    continues = np.array([t.startswith("##") for t in vocab])
    wordy = np.array([t.lstrip("#").isalpha() for t in vocab])
    # Sentences of prose: 6 to 60 pieces, at least 80% of them letters (not code, tables or formulas).
    sentences = [ids for i in range(len(held_out)) for ids in held_out.document(i)[0]
                 if 6 <= len(ids) <= 60 and wordy[ids].mean() >= 0.8]
    rng = np.random.default_rng(seed)
    chosen: list[tuple[np.ndarray, int]] = []
    for index in rng.permutation(len(sentences)):
        ids = sentences[index]
        whole = maskable[ids] & ~np.append(continues[ids[1:]], False)  # a word of one piece
        positions = np.flatnonzero(whole)
        if len(positions):
            chosen.append((ids, int(rng.choice(positions))))
            if len(chosen) >= prompts:
                break
    if not chosen:
        raise ValueError(f"{data_dir}: the held-out split has no prose sentence of 6-60 pieces with a maskable "
                         f"word")
    return chosen


def _maskable_counts(data_dir: Path, vocab_size: int, maskable: np.ndarray) -> np.ndarray:
    """How often each maskable piece occurs in the training split, (vocab_size,) int64; 0 for the others."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for ids in ShardedCorpus(data_dir, "train").token_stream():
        counts += np.bincount(ids, minlength=vocab_size)
    counts[~maskable] = 0
    return counts


def _predict(model, tokenizer, chosen: list[tuple[np.ndarray, int]], top_k: int,
             batch_size: int) -> tuple[list[list[int]], list[list[float]]]:
    """The model's `top_k` pieces and their probabilities at each prompt's masked position, the prompt framed as
    [CLS] sentence [SEP] alone, in batches of `batch_size`."""
    top_ids, top_p = [], []
    with torch.no_grad():
        for start in range(0, len(chosen), batch_size):
            part = chosen[start:start + batch_size]
            width = max(len(ids) for ids, _ in part) + 2
            batch = torch.full((len(part), width), tokenizer.pad_id, dtype=torch.long)
            mask = torch.zeros_like(batch)
            for row, (ids, position) in enumerate(part):
                masked = ids.copy()
                masked[position] = tokenizer.mask_id
                batch[row, :len(ids) + 2] = torch.tensor([tokenizer.cls_id, *masked.tolist(), tokenizer.sep_id])
                mask[row, :len(ids) + 2] = 1
            logits = model(batch, mask, torch.zeros_like(batch)).prediction_logits  # (B, T, V)
            rows = torch.arange(len(part))
            at = torch.tensor([position + 1 for _, position in part])  # +1: [CLS] comes first
            probs = logits[rows, at].float().softmax(-1)  # (B, V)
            top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
            top_ids.extend(top.indices.tolist())
            top_p.extend(top.values.tolist())
    return top_ids, top_p


def _band_scores(band_of: list[int], answers: list[int], correct: list[bool], in_top5: list[bool],
                 counts: np.ndarray) -> list[dict[str, Any]]:
    """Per band of `FREQUENCY_BANDS`: its prompts' top-1 and top-5 accuracy, beside the band's frequency baseline
    (always its most frequent word, or its five most frequent); None where the band has no prompt."""
    bands = []
    for k, (name, low, high) in enumerate(FREQUENCY_BANDS):
        members = [i for i, b in enumerate(band_of) if b == k]
        # The frequency baseline within the band: always the band's most frequent word (top-1), or its five.
        band_words = np.argsort(-counts, kind="stable")[low:min(high, low + 5)].tolist()
        m = len(members)
        bands.append({"band": name, "ranks": [low, high if high < len(counts) else None], "prompts": m,
                      "top1_accuracy": sum(correct[i] for i in members) / m if m else None,
                      "top5_accuracy": sum(in_top5[i] for i in members) / m if m else None,
                      "baseline_top1": (sum(answers[i] == band_words[0] for i in members) / m
                                        if m and band_words else None),
                      "baseline_top5": (sum(answers[i] in band_words for i in members) / m
                                        if m and band_words else None)})
    return bands
