"""`bertkit fill-mask`, `generate`, `info` and `similarity`: a model directory asked directly."""

from __future__ import annotations

import argparse
import json

from bertkit.cli.options import add_words_option
from bertkit.features import word_similarity
from bertkit.inference import fill_mask, generate, model_info


def cmd_fill_mask(args: argparse.Namespace) -> None:
    for text in args.text:
        results = fill_mask(args.model, text, top_k=args.top_k)
        if args.json:
            print(json.dumps({"text": text, "predictions": results}, ensure_ascii=False))
            continue
        print(text)
        for position, candidates in enumerate(results):
            label = f"[MASK] #{position + 1}: " if len(results) > 1 else ""
            print("  " + label + "  ".join(f"{c['token']} ({c['probability']:.3f})" for c in candidates))


def cmd_generate(args: argparse.Namespace) -> None:
    for item in generate(args.model, args.text, args.max_new_tokens, args.temperature, args.top_k, args.seed,
                         num_beams=args.num_beams, length_penalty=args.length_penalty):
        print(json.dumps(item, ensure_ascii=False) if args.json else f"{item['prompt']} -> {item['continuation']}")


def cmd_info(args: argparse.Namespace) -> None:
    info = model_info(args.model)
    if args.json:
        print(json.dumps(info, indent=2))
        return
    for key, value in info.items():
        if isinstance(value, dict):
            print(f"{key}:")
            for k, v in value.items():
                print(f"  {k:<30} {v}")
        else:
            print(f"{key:<32} {value}")


def cmd_similarity(args: argparse.Namespace) -> None:
    result = word_similarity(args.model, args.word, args.texts, max_seq_length=args.max_seq_length,
                             words=args.words)
    if args.json:
        print(json.dumps(result))
        return
    for i, text in enumerate(result["texts"]):
        print(f"[{i + 1}] {text}   (token {result['tokens'][i]!r})")
    for layer in result["layers"]:
        pairs = [f"{i + 1}-{j + 1} {layer['cosine'][i][j]:.4f}" for i in range(len(result["texts"]))
                 for j in range(i + 1, len(result["texts"]))]
        same = "  (identical vectors)" if layer["identical"] else ""
        print(f"layer {layer['layer']}: cosine {', '.join(pairs)}{same}")


def add_fill_mask(verbs, help_text: str) -> None:
    fill = verbs.add_parser("fill-mask", help=help_text,
                            description="Top-k predictions with probabilities for every [MASK] in each TEXT.")
    fill.add_argument("--model", required=True, help="model directory with pretraining heads")
    fill.add_argument("--top-k", type=int, default=5, help="candidates per [MASK] (default 5)")
    fill.add_argument("--json", action="store_true", help="one JSON object per text")
    fill.add_argument("text", nargs="+", help='text containing [MASK], e.g. "paris is the [MASK] of france"')
    fill.set_defaults(func=cmd_fill_mask)


def add_generate(verbs, help_text: str) -> None:
    """Continue each TEXT with a model pretrained with --objective causal, or write the output of an encoder-decoder
    (T5) for it (e.g. "translate English to German: ...", or a text with <extra_id_0> sentinels): greedy by default,
    sampled with --temperature > 0, beam search (T5) with --num-beams > 1."""
    gen = verbs.add_parser("generate", help=help_text, description=add_generate.__doc__)
    gen.add_argument("--model", required=True, help="causal or T5 model directory")
    gen.add_argument("--max-new-tokens", type=int, default=20, help="tokens to add at most (default 20)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    gen.add_argument("--top-k", type=int, default=None, help="sample among the k most likely tokens")
    gen.add_argument("--seed", type=int, default=0, help="seed of the sampling (default 0)")
    gen.add_argument("--num-beams", type=int, default=1, help="T5: beam search with this many beams (default 1)")
    gen.add_argument("--length-penalty", type=float, default=1.0,
                     help="T5 beam search: hypotheses ranked by log-probability / length ** this (default 1.0)")
    gen.add_argument("--json", action="store_true", help="one JSON object per text")
    gen.add_argument("text", nargs="+", help="prompt text")
    gen.set_defaults(func=cmd_generate)


def add_info(verbs, help_text: str) -> None:
    info = verbs.add_parser("info", help=help_text,
                            description="Print the config, parameter count and files of a model directory.")
    info.add_argument("model", help="model directory")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(func=cmd_info)


def add_similarity(verbs, help_text: str) -> None:
    """Print the cosine similarity of WORD's vectors (its first occurrence in each text, first token) between the
    texts, at every layer of the model (0 = embeddings, or ELMo's context-free token layer)."""
    sim = verbs.add_parser("similarity", help=help_text, description=add_similarity.__doc__)
    sim.add_argument("--model", required=True, help="model directory (any encoder; ELMo included)")
    sim.add_argument("--word", required=True, help="the word to compare, e.g. bank")
    sim.add_argument("texts", nargs="+", help="two or more texts containing the word")
    sim.add_argument("--max-seq-length", type=int, default=512, help="truncate to this many tokens (default 512)")
    sim.add_argument("--json", action="store_true", help="print the result as one JSON object")
    add_words_option(sim)
    sim.set_defaults(func=cmd_similarity)


PARSERS = {"fill-mask": add_fill_mask, "generate": add_generate, "info": add_info, "similarity": add_similarity}
