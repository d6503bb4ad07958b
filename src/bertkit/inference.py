"""Inference helpers behind `bertkit fill-mask`, `bertkit generate` and `bertkit info`."""

from __future__ import annotations

import os
from typing import Any

import torch

from bertkit.checkpoint import read_weights, tensor_role
from bertkit.models import BertForPreTraining, ModelDir
from bertkit.models.registry import architecture_of
from bertkit.tokenizers import WordPieceTokenizer


@torch.no_grad()
def fill_mask(model: str | os.PathLike | BertForPreTraining, text: str, top_k: int = 5,
              tokenizer: WordPieceTokenizer | None = None) -> list[list[dict[str, Any]]]:
    """Top-k candidates for every [MASK] in `text`: one list per [MASK], each item {token, id, probability}.

    `model` is a model directory (its tokenizer, WordPiece or byte-level BPE, is read from it) or a loaded model
    plus `tokenizer`. With a BPE tokenizer the mask is written "<mask>".
    """
    if not isinstance(model, torch.nn.Module):
        directory = ModelDir.open(model)
        if directory.text_to_text:
            raise ValueError(f"bertkit fill-mask: {directory} holds a {directory.model_type} model (model_type "
                             f"{directory.model_type}), which has no masked-LM head; it fills spans marked by its "
                             f"sentinels: bertkit generate --model {directory} \"text with <extra_id_0> in it\"")
        tokenizer = tokenizer or directory.tokenizer()
        model = directory.load("fill-mask")  # the pretraining model; ModernBERT's: its MLM model
    if tokenizer is None:
        raise ValueError("fill_mask needs a tokenizer when given a loaded model")
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    model.eval()
    enc = tokenizer.encode(text, max_length=model.config.max_length)
    positions = [i for i, t in enumerate(enc.input_ids) if t == tokenizer.mask_id]
    if not positions:
        raise ValueError(f"no {tokenizer.id_to_token(tokenizer.mask_id)} token in {text!r}")
    device = next(model.parameters()).device
    ids = torch.tensor([enc.input_ids], device=device)
    types = torch.tensor([enc.token_type_ids], device=device)
    # How the architecture's LM is asked (its registry row): a masked-LM head reads the mask token; XLNet's LM
    # answers through the permutation inputs.
    if architecture_of(model.config).mask_prediction == "permutation":
        # XLNet predicts through its query stream: every mask position hidden from every token (itself included),
        # one target row per mask
        T, M = ids.shape[1], len(positions)
        perm_mask = torch.zeros(1, T, T, device=device)
        perm_mask[0, :, positions] = 1.0
        mapping = torch.zeros(1, M, T, device=device)
        mapping[0, torch.arange(M), torch.tensor(positions)] = 1.0
        with torch.no_grad():
            logits = model(ids, torch.ones_like(ids), types, perm_mask=perm_mask, target_mapping=mapping).logits
        probs = logits[0].float().softmax(-1)  # (M, V)
    else:
        logits = model(ids, torch.ones_like(ids), types).prediction_logits
        probs = logits[0, positions].float().softmax(-1)  # (M, V)
    return top_candidates(probs, top_k, tokenizer)


def top_candidates(probs: torch.Tensor, top_k: int, tokenizer) -> list[list[dict[str, Any]]]:
    """probs (M, V), one row per mask -> each row's `top_k` {token, id, probability}, most likely first: what
    `bertkit fill-mask --json` prints (and the server answers) for each mask."""
    top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
    return [[{"token": tokenizer.id_to_token(int(i)), "id": int(i), "probability": float(p)}
             for p, i in zip(row_p, row_i)] for row_p, row_i in zip(top.values, top.indices)]


def generate(model: str | os.PathLike, prompts: list[str], max_new_tokens: int = 20, temperature: float = 0.0,
             top_k: int | None = None, seed: int = 0, num_beams: int = 1,
             length_penalty: float = 1.0) -> list[dict[str, Any]]:
    """Continue each prompt with a causal model directory (`--objective causal`), or answer it with an
    encoder-decoder (T5): greedy at temperature 0, else sampled (top-k when given) with `seed`; T5 also by beam
    search (num_beams > 1, hypotheses ranked by log-probability / length ** length_penalty). Returns one
    {prompt, continuation, ids} per prompt.

    Causal: the prompt is encoded as in training ([CLS]/<s> first) without its closing separator; generation stops
    at the separator (the end of a document) or after max_new_tokens. T5: the prompt is the encoder's input as
    T5 frames it (`text </s>`, e.g. "translate English to German: ..." or a text with <extra_id_0> sentinels); the
    continuation is what the decoder writes up to EOS (ids without the decoder's start token and EOS).
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    directory = ModelDir.open(model)
    if directory.text_to_text:
        return _generate_text_to_text(directory, prompts, max_new_tokens, temperature, top_k, seed, num_beams,
                                      length_penalty)
    if num_beams != 1:
        raise ValueError("--num-beams: beam search is built for encoder-decoders (T5); a causal model generates "
                         "greedily or by sampling")
    lm = directory.load("generate").eval()  # BertForCausalLM; ValueError for a model that is not causal
    tokenizer = directory.tokenizer()
    results = []
    for text in prompts:
        ids = tokenizer.encode(text, max_length=lm.config.max_length).input_ids[:-1]  # without the closing separator
        out = lm.generate(torch.tensor([ids]), max_new_tokens, temperature=temperature, top_k=top_k,
                          eos_token_id=tokenizer.sep_id, generator=torch.Generator().manual_seed(seed))
        new = out[0, len(ids):].tolist()
        results.append({"prompt": text, "continuation": tokenizer.decode(new), "ids": new})
    return results


def _generate_text_to_text(directory: ModelDir, prompts: list[str], max_new_tokens: int, temperature: float,
                           top_k: int | None, seed: int, num_beams: int, length_penalty: float) -> list[dict[str, Any]]:
    """`generate` for an encoder-decoder directory (T5ForConditionalGeneration.generate, one prompt at a time)."""
    tokenizer = directory.tokenizer()
    model = directory.load("generate").eval()
    eos = model.config.eos_token_id
    generator = torch.Generator().manual_seed(seed)
    results = []
    for text in prompts:
        ids = torch.tensor([tokenizer.encode(text).input_ids])
        out = model.generate(ids, torch.ones_like(ids), max_new_tokens=max_new_tokens, num_beams=num_beams,
                             temperature=temperature, top_k=top_k, generator=generator,
                             length_penalty=length_penalty)[0, 1:].tolist()  # without the decoder's start token
        new = out[:out.index(eos)] if eos in out else out
        # Sentinels stay visible (<extra_id_0> cat <extra_id_1> ...): they say which span a text fills.
        shown = [i for i in new if i != model.config.pad_token_id]
        results.append({"prompt": text, "continuation": tokenizer.decode(shown, skip_special_tokens=False),
                        "ids": new})
    return results


def model_info(directory: str | os.PathLike) -> dict[str, Any]:
    """Config, parameter counts, heads present and files of a model directory.

    The counts follow the family's tables in `bertkit.checkpoint` (BERT's `cls.`, RoBERTa's `lm_head.`, ALBERT's
    `predictions.`, ELECTRA's `generator_predictions.` / `discriminator_predictions.`, task heads' `classifier.` /
    `qa_outputs.`): parameters_encoder + parameters_heads = parameters_total, the number of distinct parameters of
    the model the directory loads into (buffers and tied decoder copies are not parameters). `heads` lists the head
    families (`bertkit.checkpoint.FORMATS[...].heads`) the directory holds tensors of; tensors no table knows are
    counted in parameters_total and listed under `unknown_tensors`.
    """
    model_dir = ModelDir.open(directory)
    directory, raw, config = model_dir.path, model_dir.raw, model_dir.config
    state = read_weights(directory, config)
    counts = {"encoder": 0, "head": 0, "unknown": 0}
    heads: set[str] = set()
    unknown: list[str] = []
    for name, tensor in state.items():
        role, families = tensor_role(name, config.model_type)
        if role == "redundant":
            continue
        counts[role] += tensor.numel()
        heads.update(families)
        if role == "unknown":
            unknown.append(name)
    return {
        "directory": str(directory),
        "architectures": raw.get("architectures", []),
        "config": config.to_dict(),
        "parameters_encoder": counts["encoder"],
        "parameters_heads": counts["head"],
        "parameters_total": sum(counts.values()),
        "heads": sorted(heads),
        "unknown_tensors": sorted(unknown),
        "tokenizer": any((directory / name).is_file() for name in ("vocab.txt", "vocab.json", "tokenizer.json")),
        "files": sorted(p.name for p in directory.iterdir() if p.is_file()),
    }
