"""`bertkit <verb>`: the command-line face of the Python API. Parses arguments and calls library functions only.

Every verb's errors are reported as one line on stderr (`bertkit: error: ...`) with exit status 2 for bad
input, never a traceback; `BERTKIT_DEBUG=1` shows the traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from bertkit.errors import missing_extra
from bertkit.models.registry import ARCHITECTURES


# ------------------------------------------------------------------------------------------------------------------
# tokenizer / tokenize / fill-mask / info
# ------------------------------------------------------------------------------------------------------------------
def _corpus_args(args: argparse.Namespace) -> dict:
    """How `tokenizer train` reads its files (`bertkit.data.corpus.iter_lines`)."""
    return {"format": "arrow" if args.format == "datasets" else args.format, "text_column": args.text_column,
            "document_column": args.document_column}


def cmd_tokenizer_train(args: argparse.Namespace) -> None:
    from bertkit.data.corpus import CorpusLines, iter_lines
    from bertkit.tokenizers import ByteLevelBPETokenizer, UnigramTokenizer, WordPieceTokenizer

    if args.kind != "wordpiece" and (args.cased or args.strip_accents is not None or args.compat is not None):
        kept = "byte-level BPE keeps the text as is" if args.kind == "bpe" else "unigram normalises with NFKC only"
        raise ValueError(f"--cased, --strip-accents and --compat are WordPiece options; {kept}")
    if args.extra_ids is not None and args.kind != "unigram":
        raise ValueError("--extra-ids is a unigram option (T5's sentinel tokens)")
    if args.kind == "word":
        from bertkit.tokenizers import WordTokenizer

        tok = WordTokenizer.train(iter_lines(args.files, **_corpus_args(args)), vocab_size=args.vocab_size or 30000,
                                  min_frequency=1 if args.min_frequency is None else args.min_frequency,
                                  show_progress=not args.quiet)
        tok.save(args.out)
        print(f"wrote a {tok.vocab_size}-word vocabulary and {len(tok.chars)} characters (tokenizer.json + "
              f"word_chars.json) to {args.out}")
        return
    if args.min_frequency is not None and args.kind == "unigram":
        raise ValueError("--min-frequency is a wordpiece / bpe option; unigram prunes by likelihood")
    # file:line errors come from the corpus reader; training reads the files twice
    texts = CorpusLines(args.files, **_corpus_args(args))
    vocab_size = args.vocab_size or (32100 if args.kind == "unigram" else 30522)
    min_frequency = 2 if args.min_frequency is None else args.min_frequency
    if getattr(args, "xlnet", False) and (args.kind != "unigram" or args.extra_ids is not None):
        raise ValueError("--xlnet is a unigram option without --extra-ids (XLNet's special tokens, no sentinels)")
    if args.kind == "unigram":
        tok = UnigramTokenizer.train(texts, vocab_size=vocab_size, show_progress=not args.quiet,
                                     extra_ids=100 if args.extra_ids is None else args.extra_ids,
                                     xlnet=getattr(args, "xlnet", False))
        tok.save(args.out)
        what = "XLNet's special tokens" if getattr(args, "xlnet", False) else f"{tok.extra_ids} extra ids"
        print(f"wrote a {tok.vocab_size}-token Unigram vocabulary ({what}, tokenizer.json) to {args.out}")
        return
    if args.kind == "bpe":
        tok = ByteLevelBPETokenizer.train(texts, vocab_size=vocab_size, min_frequency=min_frequency,
                                          show_progress=not args.quiet)
        tok.save(args.out)
        print(f"wrote a {tok.vocab_size}-token byte-level BPE vocabulary (vocab.json + merges.txt) to {args.out}")
        return
    tok = WordPieceTokenizer.train(texts, vocab_size=vocab_size, min_frequency=min_frequency,
                                   lowercase=not args.cased, strip_accents=args.strip_accents,
                                   show_progress=not args.quiet, compat=args.compat or "transformers")
    tok.save(args.out)
    print(f"wrote a {tok.vocab_size}-token {'cased' if args.cased else 'uncased'} vocabulary to {args.out}")


def add_wordpiece_rule_options(parser: argparse.ArgumentParser) -> None:
    """--compat, --cased/--no-cased (or --lowercase true|false), --force-casing: how a WordPiece vocabulary is
    applied (`load_with_rules`)."""
    parser.add_argument("--compat", choices=["google", "transformers"],
                        help="WordPiece rules: google (tokenization.py; the default for a bare vocab.txt) or "
                             "transformers (BertTokenizer; the default for a directory transformers wrote)")
    casing = parser.add_mutually_exclusive_group()
    casing.add_argument("--cased", action=argparse.BooleanOptionalAction, default=None,
                        help="override the casing (a bare vocab.txt: cased when it holds capitalised pieces)")
    casing.add_argument("--lowercase", choices=["true", "false"], help="the same as --no-cased / --cased")
    parser.add_argument("--force-casing", action="store_true",
                        help="accept a casing that contradicts the vocabulary")


def load_with_rules(path: str, kind: str | None, args: argparse.Namespace):
    """`load_tokenizer` with the options of `add_wordpiece_rule_options`; says on stderr, in one line, which rules
    and casing a bare vocab.txt got."""
    from bertkit.tokenizers import detect_tokenizer_kind, load_tokenizer as load

    if args.lowercase is not None:
        args.cased = args.lowercase == "false"
    given = [name for name, value in (("--cased", args.cased), ("--compat", args.compat)) if value is not None]
    found = kind or detect_tokenizer_kind(path)
    if found != "wordpiece":
        if given:
            raise ValueError(f"{' and '.join(given)} appl{'y' if len(given) > 1 else 'ies'} to a WordPiece "
                             f"vocabulary; {path} holds a {found} tokenizer, whose files decide its rules")
        return load(path, kind=kind)
    tok = load(path, kind=kind, compat=args.compat, lowercase=None if args.cased is None else not args.cased,
               force_casing=args.force_casing)
    if tok.rules_note:
        print(tok.rules_note, file=sys.stderr)
    return tok


def cmd_tokenize(args: argparse.Namespace) -> None:
    tok = load_with_rules(args.model_or_vocab, args.tokenizer_kind, args)
    needed = tok.num_special_tokens(args.pair is not None)
    if args.max_length is not None and args.max_length < needed:
        frame = tok.build_inputs([], None if args.pair is None else [])[0]
        raise ValueError(f"--max-length {args.max_length} is too small: the special tokens alone take {needed} "
                         f"({' '.join(tok.convert_ids_to_tokens(frame))}); give at least {needed + 1} for any text")
    enc = tok.encode(args.text, pair=args.pair, max_length=args.max_length)
    if args.json:
        print(json.dumps({"tokens": enc.tokens, "input_ids": enc.input_ids, "token_type_ids": enc.token_type_ids,
                          "attention_mask": enc.attention_mask, "offsets": enc.offsets, "word_ids": enc.word_ids,
                          "sequence_ids": enc.sequence_ids, "special_tokens_mask": enc.special_tokens_mask},
                         ensure_ascii=False))
        return
    width = max((len(t) for t in enc.tokens), default=0)
    for token, index, ttype in zip(enc.tokens, enc.input_ids, enc.token_type_ids):
        print(f"{token:<{width}}  {index:>6}  {ttype}")


def cmd_fill_mask(args: argparse.Namespace) -> None:
    from bertkit.inference import fill_mask

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
    from bertkit.inference import generate

    for item in generate(args.model, args.text, args.max_new_tokens, args.temperature, args.top_k, args.seed,
                         num_beams=args.num_beams, length_penalty=args.length_penalty):
        print(json.dumps(item, ensure_ascii=False) if args.json else f"{item['prompt']} -> {item['continuation']}")


def cmd_info(args: argparse.Namespace) -> None:
    from bertkit.inference import model_info

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


# ------------------------------------------------------------------------------------------------------------------
# prepare / pretrain / plot / pipeline
# ------------------------------------------------------------------------------------------------------------------
def cmd_prepare(args: argparse.Namespace) -> None:
    from bertkit.data.prepare import prepare

    tokenizer = load_with_rules(args.tokenizer, args.tokenizer_kind, args)
    manifest = prepare(args.corpus, tokenizer, args.out, eval_paths=args.eval_corpus,
                       eval_fraction=args.eval_fraction, format=args.format, on_bad_line=args.on_bad_line,
                       shard_tokens=args.shard_tokens, seed=args.seed, progress=not args.quiet,
                       tokenizer_kind=args.tokenizer_kind, text_column=args.text_column,
                       document_column=args.document_column)
    print(json.dumps(manifest.summary() if hasattr(manifest, "summary") else {"out": args.out}, indent=2))


def parse_overrides(extra: list[str]) -> dict[str, str]:
    """`--key value` / `--key=value` pairs left over by argparse -> {key: value} (dashes become underscores)."""
    out: dict[str, str] = {}
    i = 0
    while i < len(extra):
        item = extra[i]
        if not item.startswith("--") or len(item) < 3:
            raise ValueError(f"unexpected argument {item!r}; settings are given as --field value")
        key, eq, value = item[2:].partition("=")
        if not eq:
            if i + 1 >= len(extra) or extra[i + 1].startswith("--"):
                raise ValueError(f"--{key} needs a value")
            value = extra[i + 1]
            i += 1
        out[key.replace("-", "_")] = value
        i += 1
    return out


def _recipe_overrides(args: argparse.Namespace, extra: list[str]) -> dict:
    """The recipe settings of a command line: the generated --field options and --section.field pairs."""
    overrides = parse_overrides(extra)
    overrides.update({key[len(_FIELD):]: value for key, value in vars(args).items()
                      if key.startswith(_FIELD) and value is not None})
    return overrides


def _print_summary(summary: dict, out: str) -> None:
    """A run's summary as one JSON line with its model directory (rank 0 only under torchrun)."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({**summary, "model": str(Path(out) / "model")}, default=float))


def _print_train_result(result, out: str) -> None:
    _print_summary({"step": result.step, "tokens": result.tokens, "elapsed_s": round(result.elapsed, 1),
                    "stopped_by": result.stopped_by, **result.eval_metrics}, out)


def cmd_pretrain(args: argparse.Namespace, extra: list[str]) -> None:
    from bertkit.training.pretrain import pretrain, resolve_config

    overrides = _recipe_overrides(args, extra)
    if args.preset is not None:
        overrides["preset"] = args.preset
    config = resolve_config(args.config, overrides)
    _print_train_result(pretrain(args.data, args.out, config, resume=args.resume, init_from=args.init_from,
                                 verify_data=args.verify), args.out)


def cmd_init(args: argparse.Namespace) -> None:
    from bertkit.training.pretrain import init_like, init_model_dir

    if args.like is not None:
        path = init_like(args.out, args.like, seed=args.seed)
        print(f"wrote a randomly initialised copy of {args.like}'s architecture (and tokenizer) to {path}")
        return
    if args.tokenizer is None:
        raise ValueError("bertkit init needs --tokenizer (or --like MODEL_DIR to copy an architecture)")
    path = init_model_dir(args.out, args.tokenizer, preset=args.preset, seed=args.seed, model_type=args.model_type)
    from bertkit.models.registry import architecture

    name = architecture(args.model_type).label
    print(f"wrote a randomly initialised {args.preset} {name} to {path}")


def cmd_extend_context(args: argparse.Namespace) -> None:
    from bertkit.training.pretrain import extend_context

    print(json.dumps(extend_context(args.model, args.max_position_embeddings, args.out, method=args.method,
                                    global_rope_theta=args.global_rope_theta)))


def cmd_plot(args: argparse.Namespace) -> None:
    from bertkit.pipeline.plots import plot_run

    for path in plot_run(args.run_dir, args.out):
        print(path)


def cmd_analyze_layers(args: argparse.Namespace) -> None:
    from bertkit.pipeline.analyze import analyze_layers

    report = analyze_layers(args.model, args.input, args.out, names=args.name, max_seq_length=args.max_seq_length,
                            batch_size=args.batch_size, device=args.device)
    print(f"distance between each layer's input and output, mean over {sum(m['tokens'] for m in report['models']):,} "
          f"tokens of {report['texts']:,} texts")
    print(report["table"])
    for path in report.get("files", []):
        print(path)


def cmd_pipeline(args: argparse.Namespace) -> None:
    from bertkit.pipeline import run_pipeline

    run_pipeline(args.out, corpus=args.corpus, minutes=args.minutes, preset=args.preset,
                 vocab_size=args.vocab_size, probes=args.probe, seed=args.seed, task_train=args.task_train,
                 task_dev=args.task_dev, text_column=args.text_column, pair_column=args.pair_column,
                 label_column=args.label_column, precision=args.precision)


# ------------------------------------------------------------------------------------------------------------------
# finetune / evaluate / predict / features
# ------------------------------------------------------------------------------------------------------------------
def _finetune_config(args: argparse.Namespace):
    """The FinetuneConfig that a `finetune` or `distill` task verb's options describe (unset ones keep defaults)."""
    import dataclasses

    from bertkit.tasks.run import FinetuneConfig, config_fields

    given = _given(args, config_fields(), skip=("kind",))
    if args.quiet:
        given["progress"] = False
    return dataclasses.replace(FinetuneConfig(), kind=args.kind, **given)


def cmd_finetune(args: argparse.Namespace) -> None:
    from bertkit.tasks.finetune import finetune

    config = _finetune_config(args)
    if args.seeds is not None or args.lr_grid is not None:
        return _finetune_sweep(args, config)
    results = finetune(args.kind, args.model, args.train, args.dev, args.out, config, resume=args.resume,
                       new_heads=args.new_head, eval_files=args.eval_file or ())
    _draw_confusion(results, Path(args.out))
    _print_summary({k: results.get(k) for k in ("kind", "task", "metric", "best", "train_examples_per_s", "steps")},
                   args.out)


def _draw_confusion(results: dict, out: Path, title: str = "") -> None:
    """OUT/confusion_matrix.png when the results hold confusion matrices and matplotlib is there."""
    if results.get("confusion_matrix") and int(os.environ.get("RANK", "0")) == 0:
        from bertkit.pipeline.plots import plot_confusion

        try:
            plot_confusion(results["confusion_matrix"], out / "confusion_matrix.png", title)
        except ImportError as err:
            print(f"bertkit: {err}; confusion_matrix.png not drawn", file=sys.stderr)


def _finetune_sweep(args: argparse.Namespace, config) -> None:
    """`finetune --seeds/--lr-grid`: one run per seed (and learning rate), the card, its figures."""
    from bertkit.tasks.card import card_markdown, find_runs, merge_cards, parse_grid, parse_seeds, read_results
    from bertkit.tasks.finetune import finetune_sweep

    if args.resume:
        raise ValueError("--resume: a sweep continues by itself (run the same command again); drop --resume")
    seeds = parse_seeds(args.seeds if args.seeds is not None else str(config.seed))
    rates = parse_grid(args.lr_grid) if args.lr_grid is not None else None
    if rates is not None and args.learning_rate is not None:
        raise ValueError("give either --lr/--learning-rate (one setting) or --lr-grid (a grid), not both")
    card = finetune_sweep(args.kind, args.model, args.train, args.dev, args.out, config, seeds=seeds,
                          learning_rates=rates, new_heads=args.new_head, eval_files=args.eval_file or (),
                          name=args.name)
    out = Path(args.out)
    for run in find_runs(out):
        _draw_confusion(read_results(run), run)
    _draw_confusion(card, out, f"{card['name']}: {card['task']}")
    try:
        from bertkit.pipeline.plots import plot_card

        plot_card(merge_cards([card], metrics=list(card["stats"])), out / "card.png")
    except ImportError as err:
        print(f"bertkit: {err}; card.png not drawn", file=sys.stderr)
    print(card_markdown(card), end="")


def cmd_card(args: argparse.Namespace) -> None:
    from bertkit.tasks.card import merge_cards, merged_markdown, read_card, write_card

    cards = []
    for spec in args.run_dirs:
        name, _, path = spec.partition("=") if "=" in spec and not Path(spec).exists() else ("", "", spec)
        cards.append(read_card(path, name=name or None))
    table = merge_cards(cards, metrics=args.metric)
    if not table["columns"]:
        raise ValueError(f"--metric {args.metric}: no card has it")
    print(merged_markdown(table), end="")
    if args.out is not None:
        from bertkit.pipeline.plots import plot_card

        print(write_card(args.out, table))
        print(plot_card(table, Path(args.out) / "card.png"))


def cmd_evaluate(args: argparse.Namespace) -> None:
    from bertkit.tasks.finetune import evaluate_predictions

    metrics = evaluate_predictions(args.kind, args.data, args.predictions, args.null_odds, task=args.task,
                                   text_column=args.text_column, pair_column=args.pair_column,
                                   label_column=args.label_column, regression=args.regression,
                                   column=args.column, scheme=args.scheme, **_table_args(args))
    print(json.dumps(metrics, indent=None if args.compact else 2))


# The flag of `bertkit predict` that gives each input field (`TaskFamily.input_fields`).
_FIELD_FLAGS = {"text": "text", "pair": "pair", "question": "question", "context": "context", "choices": "choice"}


def _predict_inputs(args: argparse.Namespace) -> list:
    """The inputs of `bertkit predict`: from the flags, or from --input (JSON Lines or tab-separated lines), read
    as the kind's family reads a JSON input (`TaskFamily.input_fields`, `input_from_json`)."""
    from bertkit.data.readers import is_table_input
    from bertkit.tasks.base import family_for

    kind, family = args.kind, family_for(args.kind)
    required, optional = family.input_fields
    keys = (*required, *optional)
    if args.input is None:
        record = {k: getattr(args, _FIELD_FLAGS[k]) for k in keys if getattr(args, _FIELD_FLAGS[k])}
        if any(k not in record for k in required):
            what = " and ".join(f"--{_FIELD_FLAGS[k]}" + (" (repeated)" if k == "choices" else "")
                                + (f" ({family.input_notes[k]})" if k in family.input_notes else "") for k in required)
            raise ValueError(f"{kind} prediction needs {what} (or --input)")
        return [family.input_from_json(record)]
    path = Path(args.input)
    if is_table_input(path, args.format):  # Parquet, Arrow, a datasets directory, JSON records, CSV
        columns = {"text": args.text_column, "pair": args.pair_column}
        return family.inputs_from_table(path, args.format, args.records,
                                        {k: v for k, v in columns.items() if v is not None})
    lines = [(n, line) for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
             if line.strip()]
    inputs = []
    for number, line in lines:
        if path.suffix.lower() in (".jsonl", ".json", ".ndjson"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: invalid JSON: {err.msg}") from None
            if not isinstance(record, dict) or any(k not in record for k in required):
                raise ValueError(f"{path}:{number}: expected a JSON object with keys {list(keys)}")
        else:  # the fields in order; a list field (swag's choices) takes the rest of the line
            fields = line.split("\t")
            record = {k: (fields[i:] if k == "choices" else fields[i]) for i, k in enumerate(keys) if i < len(fields)}
            if any(not record.get(k) for k in required):
                raise ValueError(f"{path}:{number}: expected {' and '.join(required)} separated by a tab")
        try:
            inputs.append(family.input_from_json(record))
        except ValueError as err:
            raise ValueError(f"{path}:{number}: {err}") from None
    return inputs


def cmd_predict(args: argparse.Namespace) -> None:
    from bertkit.tasks.finetune import predict
    from bertkit.tasks.base import family_for, prediction_kind

    inputs = _predict_inputs(args)
    results = predict(args.model, args.kind, inputs, batch_size=args.batch_size, max_seq_length=args.max_seq_length,
                      top_k=args.top_k, words=args.words)
    show = None if args.json else family_for(prediction_kind(args.kind)).show  # the kind's family prints its answer
    for result in results:
        print(json.dumps(result, ensure_ascii=False, default=float) if show is None else show(result))


def cmd_similarity(args: argparse.Namespace) -> None:
    from bertkit.features import word_similarity

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


def add_words_option(parser) -> None:
    """--words: how an ELMo's text splits into words (the tokenizer's own way when not given)."""
    parser.add_argument("--words", choices=["whitespace", "bert"],
                        help="ELMo: split text into words on whitespace (a released options.json + weights.hdf5 "
                             "directory's default, as bilm-tf and AllenNLP read it) or with BERT's pre-tokenizer "
                             "(bertkit's own ELMo directories' default)")


def _features_prompt(args: argparse.Namespace) -> str:
    """The text put before each line: --query-prompt or --document-prompt, or the directory's prompt named by
    --prompt-name (sentence-transformers' `encode(prompt_name=...)`)."""
    from bertkit.sentence import read_sentence_config

    given = [x for x in (args.query_prompt, args.document_prompt, args.prompt_name) if x is not None]
    if len(given) > 1:
        raise ValueError("give one of --query-prompt, --document-prompt and --prompt-name")
    if args.prompt_name is None:
        return given[0] if given else ""
    sentence = read_sentence_config(args.model)
    prompts = sentence.prompts if sentence is not None else {}
    if args.prompt_name not in prompts:
        raise ValueError(f"--prompt-name {args.prompt_name!r}: {args.model} has "
                         f"{', '.join(sorted(prompts)) or 'no prompts'} (config_sentence_transformers.json)")
    return prompts[args.prompt_name]


def cmd_features(args: argparse.Namespace) -> None:
    from bertkit.data.readers import column_texts, is_table_input
    from bertkit.features import extract_features, write_features
    from bertkit.io import lock_directory
    from bertkit.tokenizers import load_tokenizer

    try:
        layers = [int(x) for x in args.layers.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--layers {args.layers!r}: give comma-separated layer indices, e.g. -1,-2,-3,-4") from None
    if is_table_input(args.input, args.format):  # one input per row: the --text-column of a table
        texts = column_texts(args.input, args.text_column or "text", args.format, args.records)
    else:
        texts = Path(args.input).read_text(encoding="utf-8").splitlines()
    out = Path(args.out)
    from bertkit.sentence import read_sentence_config

    # Sentence vectors: a pooling asked for, or (auto) a sentence-transformers directory's own.
    pooling = args.pooling if args.pooling != "auto" else (
        "directory" if read_sentence_config(args.model) is not None else "none")
    if pooling != "none":
        from bertkit.features import encode_sentences, write_embeddings

        with lock_directory(out.parent, name=f".{out.name}.lock"):
            vectors = encode_sentences(args.model, texts, None if pooling == "directory" else pooling,
                                       batch_size=args.batch_size, max_seq_length=args.max_seq_length,
                                       prompt=_features_prompt(args), dimensions=args.dimensions,
                                       window=args.window, stride=args.stride, per_window=args.per_window)
            windows = vectors[1:] if args.per_window else None
            vectors = vectors[0] if args.per_window else vectors
            written = write_embeddings(out, vectors, pooling, windows)
        print(json.dumps({"lines": len(texts), "embedding_shape": list(vectors.shape), "pooling": pooling,
                          "files": [str(p) for p in written]}))
        return
    if args.window is not None or args.dimensions is not None or _features_prompt(args):
        raise ValueError("--window, --dimensions and the prompts are for sentence vectors: add --pooling")
    # One writer per output (a .npy output is three files): a second `features --out SAME` fails at once.
    tokenizer = load_tokenizer(args.model)
    with lock_directory(out.parent, name=f".{out.name}.lock"):
        features, tokens = extract_features(args.model, texts, layers=layers, combine=args.combine,
                                            batch_size=args.batch_size, max_seq_length=args.max_seq_length or 512,
                                            tokenizer=tokenizer, words=args.words, stateful=args.stateful)
        written = write_features(args.out, features, tokens, layers=layers, combine=args.combine)
    shape = list(features[0].shape[1:]) if features else []
    report = {"lines": len(features), "feature_shape": ["T", *shape], "files": [str(p) for p in written]}
    if getattr(tokenizer, "kind", None) == "word":  # ELMo: what the characters of the words had to give up
        report.update(truncated_words=tokenizer.char_stats["truncated_words"],
                      unknown_chars=tokenizer.char_stats["unknown_chars"])
    print(json.dumps(report))


# ------------------------------------------------------------------------------------------------------------------
# serve / export
# ------------------------------------------------------------------------------------------------------------------
def cmd_serve(args: argparse.Namespace) -> None:
    from bertkit.serve import ServeConfig, serve
    from bertkit.serve.app import config_fields

    config = ServeConfig(**_given(args, config_fields()))
    serve(args.model, host=args.host, port=args.port, kind=args.task, backend=args.backend, onnx_path=args.onnx,
          config=config, max_seq_length=args.max_seq_length, top_k=args.top_k, pooling=args.pooling,
          device=args.device, threads=args.threads, log_level=args.log_level, dtype=args.dtype,
          quantize=args.quantize, api_key=args.api_key, words=args.words)


def cmd_export_onnx(args: argparse.Namespace) -> None:
    from bertkit.export import export_onnx

    print(json.dumps(export_onnx(args.model, args.out, kind=args.task, opset=args.opset, check=not args.no_check)))


def add_serve_parsers(verbs) -> None:
    """`bertkit serve` and `bertkit export onnx`."""
    from bertkit.export import OPSET
    from bertkit.serve.app import config_fields
    from bertkit.serve.engine import POOLINGS, SERVED_KINDS

    srv = verbs.add_parser("serve", help="serve a model directory over HTTP, batching concurrent requests",
                           description="Serve a model directory's task (its head's: classify, ner, squad, swag; "
                                       "fill-mask for a pretraining checkpoint; generate for a causal model or a "
                                       "T5 without a task; else embeddings) on an ASGI server "
                                       "(Starlette + uvicorn): POST /v1/predict takes {\"inputs\": [...]} whose "
                                       "items are the JSON Lines objects `bertkit predict --input` reads and answers "
                                       "what `bertkit predict --json` prints for each; concurrent requests share "
                                       "forward passes of at most --max-batch-tokens real tokens. A web page at /, "
                                       "the OpenAPI schema at /docs, /healthz, /metrics (Prometheus). SIGTERM "
                                       "finishes the requests in flight, then stops.")
    srv.add_argument("--model", required=True, help="model directory")
    srv.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    srv.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    srv.add_argument("--task", choices=SERVED_KINDS, help="what to serve (default: from the directory's head)")
    srv.add_argument("--backend", choices=["torch", "onnx"], default="torch",
                     help="torch (bertkit's unpadded path, default) or onnx (a graph from `bertkit export onnx`)")
    srv.add_argument("--onnx", help="the ONNX file for --backend onnx (default MODEL/model.onnx)")
    srv.add_argument("--max-seq-length", type=int, help="tokens per input (default: as fine-tuned; longer inputs "
                                                        "are truncated and flagged \"truncated\": true)")
    srv.add_argument("--top-k", type=int, help="labels (classify), n-best answers (squad) or candidates (fill-mask) "
                                               "per input, unless a request says (default: all labels, 5, 5)")
    srv.add_argument("--pooling", choices=POOLINGS,
                     help="embeddings: the default pooling (default: the directory's sentence-transformers pooling, "
                          "else mean); none: every token's vector")
    srv.add_argument("--device", default="cpu", help="torch device (default cpu)")
    srv.add_argument("--threads", type=int, help="threads of a forward pass (default: torch's / onnxruntime's)")
    srv.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                     help="uvicorn's log level (default info)")
    # embedding and reranking models: precision and access
    emb = srv.add_argument_group("precision and access")
    emb.add_argument("--dtype", choices=["auto", "fp32", "bf16", "fp16"], default="auto",
                     help="weights' type: auto = bf16 (else fp16) on a GPU, fp32 on a CPU")
    emb.add_argument("--quantize", choices=["int8"],
                     help="CPU: dynamic int8 quantisation of every Linear layer (faster; see docs for its cosine)")
    emb.add_argument("--api-key", default=os.environ.get("BERTKIT_API_KEY"),
                     help="require `Authorization: Bearer KEY` on the API routes (default: $BERTKIT_API_KEY, none)")
    _add_config_options(srv.add_argument_group("batching and limits (ServeConfig)"), config_fields())
    add_words_option(srv)
    srv.set_defaults(func=cmd_serve)

    export = verbs.add_parser("export", help="export a model directory (ONNX)",
                              description="Write a model directory's served head in another format.")
    formats = export.add_subparsers(dest="format", metavar="FORMAT", required=True)
    onnx = formats.add_parser("onnx", help="ONNX graph with dynamic batch and sequence axes",
                              description="Write the ONNX graph (opset 18 by default) of the model directory's head "
                                          "(as `bertkit serve` would serve it, or --task) with dynamic batch and "
                                          "sequence axes, then check onnxruntime against bertkit (within 1e-4) on "
                                          "rows of different lengths. `bertkit serve --backend onnx` runs it.")
    onnx.add_argument("--model", required=True, help="model directory")
    onnx.add_argument("--out", required=True, help="the .onnx file to write")
    onnx.add_argument("--task", choices=SERVED_KINDS, help="which head (default: the directory's)")
    onnx.add_argument("--opset", type=int, default=OPSET, help=f"ONNX opset (default {OPSET})")
    onnx.add_argument("--no-check", action="store_true", help="skip the onnxruntime check")
    onnx.set_defaults(func=cmd_export_onnx)


def _add_config_options(group, fields, skip: tuple[str, ...] = (), aliases: dict[str, list[str]] | None = None,
                        metavars: dict[str, str] | None = None) -> None:
    """One --option per field of a config dataclass (its `config_fields()` rows: name, type, default, help; the
    single source of truth), default None = the config's default; a bool field is --x / --no-x."""
    import types
    import typing

    for name, hint, default, text in fields:
        if name in skip:
            continue
        flags = [f"--{name.replace('_', '-')}", *(aliases or {}).get(name, [])]
        shown = "" if default is None else f" (default {default})"
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        base = args[0] if (isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union) else hint
        if base is bool:
            group.add_argument(*flags, dest=name, action=argparse.BooleanOptionalAction, default=None,
                               help=text + shown)
        else:
            metavar = (metavars or {}).get(name) or {int: "N", float: "X", str: "NAME"}.get(base, "V")
            group.add_argument(*flags, dest=name, type=base, default=None, metavar=metavar, help=text + shown)


def _given(args: argparse.Namespace, fields, skip: tuple[str, ...] = ()) -> dict:
    """The fields of a config (`config_fields()` rows) that the command line set."""
    return {name: getattr(args, name) for name, *_ in fields
            if name not in skip and getattr(args, name, None) is not None}


_TABLE_OPTIONS = ("format", "records", "tokens_column", "tags_column")  # FinetuneConfig's fields on reading files


def _add_table_options(parser: argparse.ArgumentParser) -> None:
    """How a verb's data file is read (bertkit.data.readers): FinetuneConfig's format, records and NER columns."""
    from bertkit.tasks.run import config_fields

    _add_config_options(parser.add_argument_group("reading the data file"),
                        [row for row in config_fields() if row[0] in _TABLE_OPTIONS])


def _table_args(args: argparse.Namespace) -> dict:
    """The table options the command line set (`_add_table_options`)."""
    return {name: getattr(args, name) for name in _TABLE_OPTIONS if getattr(args, name, None) is not None}


def _add_input_table_options(parser: argparse.ArgumentParser, pair: bool = False) -> None:
    """--format, --records and the text columns of an --input that is a table (`predict`, `features`)."""
    group = parser.add_argument_group("an --input table")
    group.add_argument("--format", help="tsv, csv, jsonl, json, parquet, arrow or datasets (default: from the path)")
    group.add_argument("--records", help="JSON: the key whose list holds the records")
    group.add_argument("--text-column", help="the column of the text (default text)")
    if pair:
        group.add_argument("--pair-column", help="classify: the column of the second text (default pair)")


def _add_finetune_options(parser: argparse.ArgumentParser) -> None:
    """One --option per FinetuneConfig field."""
    from bertkit.tasks.run import config_fields

    _add_config_options(parser.add_argument_group("fine-tuning settings (FinetuneConfig)"), config_fields(),
                        skip=("kind", "progress"), aliases={"learning_rate": ["--lr"]})


def _default_recipe() -> str:
    from bertkit.training.pretrain import DEFAULT_RECIPE

    return DEFAULT_RECIPE


_FIELD = "field_"  # the argparse dest prefix of a generated recipe option (`--max-steps` -> field_max_steps)


def _add_pretrain_options(parser: argparse.ArgumentParser) -> None:
    """One --option per recipe field (data, train and every architecture's model fields: `field_help`, the single
    source of truth), a string that `resolve_config` converts to the field's type; default None = the recipe's.
    The epilog lists them by section with the values that run."""
    from bertkit.training.pretrain import field_help

    names = dict.fromkeys(name for rows in field_help().values() for name, _, _ in rows)
    for name in names:  # a field several architectures share is one option: the chosen architecture reads it
        parser.add_argument(f"--{name.replace('_', '-')}", dest=_FIELD + name, metavar="V", help=argparse.SUPPRESS)


def _preset_help() -> str:
    from bertkit.models.registry import config_classes

    return "model size, a preset of the recipe's architecture: " + "; ".join(
        f"{cls.model_types()[0]}: {', '.join(cls.PRESETS)}" for cls in config_classes())


def _pretrain_epilog() -> str:
    from bertkit.training.pretrain import field_help, recipe_names

    lines = [f"built-in recipes: {', '.join(recipe_names())}", "",
             "every field below can be set as --field value (or --section.field value):"]
    for section, rows in field_help().items():
        lines.append(f"  [{section}]")
        for name, default, text in rows:
            flag = name.replace("_", "-")
            lines.append(f"    --{flag:<30} {text} (default {default})")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------------------
# distill
# ------------------------------------------------------------------------------------------------------------------
def _distill_config(args: argparse.Namespace):
    from bertkit.training.distill import DistillConfig, config_fields

    return DistillConfig(**_given(args, config_fields()))


def cmd_distill_mlm(args: argparse.Namespace, extra: list[str]) -> None:
    from bertkit.training.distill import distill_mlm
    from bertkit.training.pretrain import resolve_config

    distill = _distill_config(args)  # before the recipe: a bad loss weight is reported first
    config = resolve_config(args.config, _recipe_overrides(args, extra))
    _print_train_result(distill_mlm(args.teacher, args.data, args.out, config, distill, student_dir=args.student,
                                    resume=args.resume), args.out)


def cmd_distill_task(args: argparse.Namespace) -> None:
    from bertkit.training.distill import distill_task

    config = _finetune_config(args)
    results = distill_task(args.kind, args.teacher, args.train, args.dev, args.out, config, _distill_config(args),
                           student_dir=args.student, transfer_path=args.transfer, resume=args.resume)
    _print_summary({k: results.get(k) for k in ("kind", "task", "metric", "best", "teacher", "student",
                                                "train_examples", "transfer_examples", "steps")}, args.out)


def cmd_distill_init_student(args: argparse.Namespace) -> None:
    from bertkit.training.distill import init_student

    path = init_student(args.source, args.out, layers=args.layers, preset=args.preset, seed=args.seed)
    print(f"wrote a student cut from {args.source} to {path}")


def _add_distill_options(parser: argparse.ArgumentParser) -> None:
    """One --option per DistillConfig field."""
    from bertkit.training.distill import config_fields

    _add_config_options(parser.add_argument_group("distillation settings (DistillConfig)"), config_fields(),
                        metavars={"student_layers_from_teacher": "LIST"})


def cmd_mine(args: argparse.Namespace) -> None:
    from bertkit.io import lock_directory
    from bertkit.mine import MineConfig, config_fields, mine_hard_negatives

    config = MineConfig(**_given(args, config_fields()))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with lock_directory(out.parent, name=f".{out.name}.lock"):
        report = mine_hard_negatives(args.model, args.pairs, out, args.corpus, config, args.anchor_column,
                                     args.positive_column, args.corpus_column)
    print(json.dumps(report))


def add_mine_parser(verbs) -> None:
    from bertkit.mine import config_fields

    mine = verbs.add_parser("mine", help="hard negatives for (query, positive) pairs from a corpus",
                            description="For each (query, positive) pair, the corpus texts the embedding model ranks "
                                        "closest to the query, outside a rank window and a margin below the "
                                        "positive's score (sentence-transformers' mine_hard_negatives rules), "
                                        "written as anchor, positive, negative_1 ... negative_k in the format of "
                                        "--out's suffix (.tsv, .csv, .jsonl) for `finetune embed` and `finetune "
                                        "rerank`.")
    mine.add_argument("--model", required=True, help="embedding model directory (its pooling and prompts), or the "
                                                     "URL of a running `bertkit serve` (http://host:port)")
    mine.add_argument("--pairs", required=True, help="(query, positive) pairs: any table `finetune embed` reads")
    mine.add_argument("--corpus", help="corpus: a .txt file (one text a line) or a table (default: the positives)")
    mine.add_argument("--out", required=True, help="the table to write: .tsv, .csv or .jsonl")
    mine.add_argument("--anchor-column", help="the pairs' query column (default anchor, sentence1, query, text)")
    mine.add_argument("--positive-column", help="the pairs' positive column (default positive, sentence2, document)")
    mine.add_argument("--corpus-column", help="a corpus table's column (default text, document, positive, ...)")
    _add_config_options(mine.add_argument_group("mining (MineConfig)"), config_fields())
    mine.set_defaults(func=cmd_mine)


def add_distill_parser(verbs) -> None:
    """`bertkit distill {mlm, glue, classify, ner, init-student}`."""
    distill = verbs.add_parser(
        "distill", help="distil a teacher into a smaller student (MLM pretraining or a fine-tuned task)",
        description="Knowledge distillation: the student learns the teacher's softened predictions (cross-entropy "
                    "at temperature T, times T^2), optionally its logits (MSE) and hidden states (MSE, through a "
                    "learned projection when the widths differ), plus the gold labels; each loss has a weight. "
                    "Writes OUT/model (the student, a model directory transformers loads) and OUT/results.json.")
    kinds = distill.add_subparsers(dest="distill_kind", metavar="KIND", required=True)

    def student_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--teacher", required=True, help="the teacher's model directory (bertkit's or transformers')")
        p.add_argument("--out", required=True, help="run directory (model, results.json, metrics, checkpoints)")
        p.add_argument("--student", help="the student's starting model directory (same vocabulary as the "
                                         "teacher); or use --student-preset / --student-layers-from-teacher")
        p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")

    mlm = kinds.add_parser("mlm", help="MLM distillation on prepared pretraining shards",
                           formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_pretrain_epilog(),
                           description="Distil an MLM teacher into a student on `bertkit prepare` shards: both see "
                                       "the same masked batches; the teacher's MLM logits at the masked positions "
                                       "are the soft targets, the masked tokens the hard ones. The recipe fields "
                                       "set the data and the optimiser (model fields: the student's config when "
                                       "it is built from the teacher's).")
    student_options(mlm)
    mlm.add_argument("--data", required=True, help="directory written by `bertkit prepare` (teacher's tokenizer)")
    mlm.add_argument("--config", help=f"recipe: a YAML file or a built-in name (data and train sections; default: "
                                      f"{_default_recipe()})")
    _add_pretrain_options(mlm)
    _add_distill_options(mlm)
    mlm.set_defaults(func=cmd_distill_mlm, takes_extra=True)

    for kind, what in (("glue", "a GLUE task (--task)"), ("classify", "your CSV / TSV / JSONL classification or "
                                                                       "regression files"),
                       ("ner", "CoNLL named-entity files")):
        task = kinds.add_parser(kind, help=f"distil a teacher fine-tuned on {what}",
                                description=f"Distil a teacher fine-tuned on {what} into a student with the same "
                                            f"head: hard and soft losses on the training file, soft losses only on "
                                            f"the --transfer examples; dev evaluated every epoch with the task's "
                                            f"metric, the best epoch kept as OUT/model. Fine-tuning settings as for "
                                            f"`bertkit finetune {kind}`.")
        student_options(task)
        task.add_argument("--train", required=True, help="labelled training file")
        task.add_argument("--dev", required=True, help="development file, evaluated every epoch")
        task.add_argument("--transfer", help="unlabelled transfer set: a .txt file (one text per line; "
                                             "text<TAB>pair for pair tasks; NER: sentences), or a file in the "
                                             "task's format whose labels are ignored")
        task.add_argument("--quiet", action="store_true", help="no progress bar")
        _add_distill_options(task)
        _add_finetune_options(task)
        task.set_defaults(func=cmd_distill_task, kind=kind)

    init = kinds.add_parser("init-student", help="write a student cut from a model directory",
                            description="Write a smaller model directory cut from SOURCE: its config at --preset "
                                        "size and/or with the --layers copied from it (DistilBERT's "
                                        "initialisation), with its tokenizer. Give it as --student to several runs "
                                        "(a baseline without the teacher, a distilled one) to start them alike.")
    init.add_argument("--from", dest="source", required=True, help="model directory to cut the student from")
    init.add_argument("--layers", help="its layers to keep, 0-based, e.g. 0,2,4")
    init.add_argument("--preset", choices=list(__import__("bertkit.config").config.PRESETS),
                      help="size preset of the student (the layers must then fit its widths)")
    init.add_argument("--seed", type=int, default=0, help="seed of whatever starts fresh (default 0)")
    init.add_argument("--out", required=True, help="model directory to write")
    init.set_defaults(func=cmd_distill_init_student)


# ------------------------------------------------------------------------------------------------------------------
# parser
# ------------------------------------------------------------------------------------------------------------------
_CORPUS_FORMATS = ["text", "jsonl", "wikitext", "parquet", "arrow", "datasets"]


def _add_corpus_columns(parser: argparse.ArgumentParser) -> None:
    """Where a corpus's text is in JSONL records and Parquet / Arrow / datasets tables."""
    parser.add_argument("--text-column", default="text",
                        help="JSONL key or Parquet/Arrow column of the text; a row is a document, its newlines its "
                             "line boundaries (default text)")
    parser.add_argument("--document-column",
                        help="Parquet/Arrow: consecutive rows with the same value here form one document")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bertkit", description="BERT and its family end to end.")
    from bertkit import __version__

    parser.add_argument("--version", action="version", version=f"bertkit {__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)

    tokenizer = verbs.add_parser("tokenizer", help="train WordPiece, byte-level BPE or Unigram vocabularies")
    tverbs = tokenizer.add_subparsers(dest="tverb", metavar="ACTION", required=True)
    train = tverbs.add_parser("train", help="learn a WordPiece (byte-level BPE, Unigram) vocabulary from text files",
                              description="Learn a WordPiece vocabulary (BERT's; --kind bpe: RoBERTa's byte-level "
                                          "BPE; --kind unigram: T5's SentencePiece-style Unigram) from corpus files "
                                          "(text, JSON Lines, .gz).")
    train.add_argument("--files", nargs="+", required=True, help="corpus files, directories or globs")
    train.add_argument("--format", choices=_CORPUS_FORMATS, help="input format (default: by extension)")
    _add_corpus_columns(train)
    train.add_argument("--kind", choices=["wordpiece", "bpe", "unigram", "word"], default="wordpiece",
                       help="wordpiece (vocab.txt, default), bpe (vocab.json + merges.txt, RoBERTa's), unigram "
                            "(tokenizer.json, T5's: <pad> </s> <unk> first, sentinels last) or word (ELMo's: "
                            "whole words by frequency + word_chars.json, the characters)")
    train.add_argument("--vocab-size", type=int, default=None,
                       help="size of the vocabulary, special tokens included (default 30522; unigram 32100, its "
                            "extra ids included)")
    train.add_argument("--min-frequency", type=int, default=None,
                       help="wordpiece / bpe: drop merges seen fewer times (default 2)")
    train.add_argument("--extra-ids", type=int, default=None,
                       help="unigram: sentinel tokens <extra_id_0>.. at the end of the vocabulary (default 100)")
    train.add_argument("--xlnet", action="store_true",
                       help="unigram: XLNet's layout (<unk> <s> </s> <cls> <sep> <pad> <mask> <eod> <eop> at ids "
                            "0-8, framing `A <sep> B <sep> <cls>`, padding on the left), for --objective xlnet")
    train.add_argument("--cased", action="store_true", help="wordpiece: keep case and accents (default: uncased)")
    train.add_argument("--compat", choices=["google", "transformers"],
                       help="wordpiece: the rules saved with the vocabulary (default transformers, which "
                            "transformers' BertTokenizer also applies; google: tokenization.py's)")
    train.add_argument("--strip-accents", action=argparse.BooleanOptionalAction, default=None,
                       help="wordpiece: strip accents (default: when uncased)")
    train.add_argument("--out", required=True, help="directory for the vocabulary and tokenizer files")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.set_defaults(func=cmd_tokenizer_train)

    from bertkit.tokenizers.load import TOKENIZER_KINDS

    tokenize = verbs.add_parser("tokenize", help="show the tokens and ids of a text",
                                description="Print the tokens, ids and token types of TEXT (and --pair) as the "
                                            "tokenizer frames them for a model.")
    tokenize.add_argument("--model-or-vocab", required=True,
                          help="model or tokenizer directory (vocab.txt, vocab.json + merges.txt, or tokenizer.json), "
                               "or a vocabulary file")
    tokenize.add_argument("--tokenizer-kind", choices=TOKENIZER_KINDS,
                          help="default: detected from the files (json reads any tokenizer.json as it stands)")
    tokenize.add_argument("--pair", help="second text (segment B)")
    tokenize.add_argument("--max-length", type=int, help="truncate (longest first) to this many tokens")
    add_wordpiece_rule_options(tokenize)
    tokenize.add_argument("--json", action="store_true", help="print one JSON object")
    tokenize.add_argument("text", help="the text to encode")
    tokenize.set_defaults(func=cmd_tokenize)

    fill = verbs.add_parser("fill-mask", help="predict the [MASK] tokens of a text",
                            description="Top-k predictions with probabilities for every [MASK] in each TEXT.")
    fill.add_argument("--model", required=True, help="model directory with pretraining heads")
    fill.add_argument("--top-k", type=int, default=5, help="candidates per [MASK] (default 5)")
    fill.add_argument("--json", action="store_true", help="one JSON object per text")
    fill.add_argument("text", nargs="+", help='text containing [MASK], e.g. "paris is the [MASK] of france"')
    fill.set_defaults(func=cmd_fill_mask)

    gen = verbs.add_parser("generate", help="continue texts with a causal model, or answer them with T5",
                           description="Continue each TEXT with a model pretrained with --objective causal, or "
                                       "write the output of an encoder-decoder (T5) for it (e.g. \"translate "
                                       "English to German: ...\", or a text with <extra_id_0> sentinels): greedy "
                                       "by default, sampled with --temperature > 0, beam search (T5) with "
                                       "--num-beams > 1.")
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

    info = verbs.add_parser("info", help="show a model directory's config and size",
                            description="Print the config, parameter count and files of a model directory.")
    info.add_argument("model", help="model directory")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(func=cmd_info)

    prep = verbs.add_parser("prepare", help="tokenise a corpus into training shards",
                            description="Tokenise text / JSON Lines corpora (optionally .gz) into memory-mapped "
                                        "token shards with sentence, document and word-start indexes.")
    prep.add_argument("--corpus", nargs="+", required=True, help="files, directories or globs")
    prep.add_argument("--tokenizer", required=True,
                      help="tokenizer or model directory (vocab.txt, vocab.json + merges.txt, or tokenizer.json), "
                           "or a vocab file")
    prep.add_argument("--tokenizer-kind", choices=TOKENIZER_KINDS,
                      help="wordpiece, bpe (byte-level, RoBERTa's), unigram (T5's) or json (any tokenizer.json); "
                           "default: detected from the files")
    prep.add_argument("--out", required=True, help="data directory to write")
    held = prep.add_mutually_exclusive_group()
    held.add_argument("--eval-corpus", nargs="+", help="held-out corpus for evaluation")
    held.add_argument("--eval-fraction", type=float, default=0.0, help="hold out this fraction of documents")
    prep.add_argument("--format", choices=_CORPUS_FORMATS, help="input format (default: by extension; a directory "
                                                                "of Parquet shards or a save_to_disk directory)")
    _add_corpus_columns(prep)
    prep.add_argument("--on-bad-line", choices=["error", "skip"], default="error",
                      help="invalid UTF-8, bad JSON or empty documents: stop (default) or skip and count")
    prep.add_argument("--shard-tokens", type=int, default=2 ** 24, help="tokens per shard (default 16M)")
    prep.add_argument("--seed", type=int, default=0, help="seed of the eval-fraction choice")
    prep.add_argument("--quiet", action="store_true", help="no progress bar")
    add_wordpiece_rule_options(prep)
    prep.set_defaults(func=cmd_prepare)

    pre = verbs.add_parser("pretrain", help="pretrain a BERT on prepared shards", allow_abbrev=False,
                           formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_pretrain_epilog(),
                           description="Pretrain with MLM+NSP (or the ALBERT / RoBERTa objectives). Launch with "
                                       "torchrun for several processes or machines.")
    pre.add_argument("--data", required=True, help="directory written by `bertkit prepare`")
    pre.add_argument("--out", required=True, help="run directory (metrics, checkpoints, model)")
    pre.add_argument("--config", help=f"recipe: a YAML file or a built-in name (default: {_default_recipe()}, "
                                      f"whose data and train values the list below shows)")
    pre.add_argument("--preset", help=_preset_help())
    _add_pretrain_options(pre)
    pre.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    pre.add_argument("--init-from", help="start from this model directory's weights (e.g. phase 2 at length 512)")
    pre.add_argument("--verify", action="store_true",
                     help="check every shard file's SHA-256 before training (by default the index files are "
                          "checked at open and each shard's token files just before its first use)")
    pre.set_defaults(func=cmd_pretrain, takes_extra=True)

    pipe = verbs.add_parser("pipeline", help="everything: corpus -> vocabulary -> shards -> pretraining -> "
                                             "fine-tuning -> evaluation -> report",
                            description="Train a vocabulary, prepare shards, pretrain a small BERT, fine-tune it and "
                                        "the same model from random initialisation on a labelled task, measure "
                                        "fill-mask accuracy on held-out text, and write OUT/report.html, all within "
                                        "--minutes. Without --corpus, a corpus is assembled from the docstrings of "
                                        "the Python sources installed on this machine; without --task-train/"
                                        "--task-dev, the task is built in (is a documentation sentence as "
                                        "written, or words drawn at random by their frequency?).")
    pipe.add_argument("--corpus", nargs="+", help="your corpus: files, directories or globs (text, JSON Lines, .gz)")
    pipe.add_argument("--out", default="runs/pipeline", help="output directory (default runs/pipeline)")
    pipe.add_argument("--minutes", type=float, default=10.0, help="total time budget (default 10)")
    pipe.add_argument("--preset", default=None, choices=["tiny", "mini", "small"],
                      help="model size (default: tiny, L2/H128, the most held-out accuracy per CPU minute; small on "
                           "a CUDA GPU)")
    pipe.add_argument("--vocab-size", type=int, default=8192, help="WordPiece vocabulary size (default 8192)")
    pipe.add_argument("--probe", action="append", help="a fill-mask sentence with [MASK] (repeatable)")
    pipe.add_argument("--seed", type=int, default=0, help="seed")
    pipe.add_argument("--task-train", help="your labelled training file for the fine-tuning stage (CSV, TSV or "
                                           "JSONL with named columns, as `bertkit finetune classify` reads)")
    pipe.add_argument("--task-dev", help="your labelled dev file (same format)")
    pipe.add_argument("--text-column", default="text", help="task files: column (key) of the text (default text)")
    pipe.add_argument("--pair-column", help="task files: column (key) of a second text, for sentence pairs")
    pipe.add_argument("--label-column", default="label", help="task files: column (key) of the label (default label)")
    pipe.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"],
                      help="auto (default): bf16 autocast where the CPU has native bf16 instructions (AVX512-BF16 "
                           "or AMX), fp32 on other CPUs; bf16 on GPUs that support it")
    pipe.set_defaults(func=cmd_pipeline)

    init = verbs.add_parser("init", help="write a randomly initialised model directory",
                            description="Write a model with its architecture's initialisation, as it pretrains "
                                        "(BERT: a BertForPreTraining; ModernBERT: its masked LM; T5: the "
                                        "encoder-decoder; ...), and the given tokenizer (a from-scratch baseline, "
                                        "a start for pretraining, a student).")
    init.add_argument("--tokenizer",
                      help="tokenizer or model directory (any kind: vocab.txt, vocab.json + merges.txt, "
                           "tokenizer.json), or a vocab file")
    init.add_argument("--like", metavar="MODEL_DIR",
                      help="copy this model directory's architecture (config.json) and tokenizer, with fresh "
                           "random weights (--seed); --tokenizer, --preset and --model-type are then not used")
    init.add_argument("--model-type", choices=list(ARCHITECTURES), default="bert",
                      help="architecture, a row of the architecture table (default bert; elmo: a word tokenizer)")
    init.add_argument("--preset", default="mini",
                      choices=list(dict.fromkeys(p for row in ARCHITECTURES.values() for p in row.presets)),
                      help="model size (default mini; each architecture's own presets)")
    init.add_argument("--seed", type=int, default=0, help="initialisation seed")
    init.add_argument("--out", required=True, help="model directory to write")
    init.set_defaults(func=cmd_init)

    ext = verbs.add_parser("extend-context", help="make a model directory take longer inputs",
                           description="Write MODEL as a directory that takes inputs of N tokens, for continued "
                                       "pretraining at that length (bertkit pretrain --init-from OUT "
                                       "--max-seq-length N). BERT family: the learned position table grows to N "
                                       "rows, by copying the learned rows one after another (the first rows stay "
                                       "as they are; Longformer's way) or by linear interpolation (the learned "
                                       "table stretched over N positions); every other tensor, head and tokenizer "
                                       "file is kept. ModernBERT (rotary positions): config.json only, and "
                                       "--global-rope-theta.")
    ext.add_argument("--model", required=True, help="model directory to extend")
    ext.add_argument("--max-position-embeddings", type=int, required=True, metavar="N",
                     help="the longest input the new directory takes, in tokens")
    ext.add_argument("--method", choices=["copy", "interpolate"], default="copy",
                     help="how the position table grows: copy (default) or interpolate")
    ext.add_argument("--global-rope-theta", type=float,
                     help="ModernBERT: the global layers' rotary base in the new directory (the paper: 160000 for "
                          "8192 tokens)")
    ext.add_argument("--out", required=True, help="new model directory (must not exist or be empty)")
    ext.set_defaults(func=cmd_extend_context)

    plot = verbs.add_parser("plot", help="draw a run's training curves as PNG",
                            description="Write PNG curves (loss, accuracy, learning rate, throughput, eval) of a run.")
    plot.add_argument("run_dir", help="run directory with metrics.jsonl")
    plot.add_argument("--out", help="output directory (default RUN_DIR/plots)")
    plot.set_defaults(func=cmd_plot)

    analyze = verbs.add_parser("analyze", help="measure what trained models do inside")
    analyses = analyze.add_subparsers(dest="analysis", required=True, metavar="ANALYSIS")
    layers = analyses.add_parser(
        "layers", help="L2 and cosine distance between each layer's input and output (ALBERT's figure 1)",
        description="For each model, the mean over the tokens of the input texts of the L2 distance and the cosine "
                    "distance (1 - cos, and the angle) between each layer's input and output embeddings; several "
                    "models are drawn side by side, as the ALBERT paper's BERT-against-ALBERT figure. Prints a "
                    "table; with --out writes OUT/layers.json and OUT/layers.png.")
    layers.add_argument("--model", nargs="+", required=True, help="model directories (any encoder, with tokenizer)")
    layers.add_argument("--input", required=True, help="text file, one text per line (blank lines skipped)")
    layers.add_argument("--out", help="output directory for layers.json and layers.png (default: print only)")
    layers.add_argument("--name", nargs="+", help="legend names, one per --model (default: the run folder names)")
    layers.add_argument("--max-seq-length", type=int, default=128, help="tokens per text, special ones included "
                                                                        "(default 128)")
    layers.add_argument("--batch-size", type=int, default=32, help="texts per forward pass (default 32)")
    layers.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    layers.set_defaults(func=cmd_analyze_layers)

    from bertkit.tasks import KINDS, family_for  # the task registry (no torch)

    kinds = list(KINDS)
    fine = verbs.add_parser("finetune", help="fine-tune a model on GLUE, a CSV/TSV/JSONL table, NER, SQuAD or SWAG",
                            description="Fine-tune a pretrained model directory on a task: a fresh head, AdamW with "
                                        "warm-up and linear decay, dev evaluation every epoch with the official "
                                        "metric; the best epoch is kept as OUT/model, every metric is in "
                                        "OUT/results.json.")
    fine.add_argument("kind", choices=kinds, help="task family")
    fine.add_argument("--model", required=True,
                      help="pretrained model directory (with its tokenizer files, any kind)")
    fine.add_argument("--train", required=True, help="training file")
    fine.add_argument("--dev", required=True, help="development file, evaluated every epoch")
    fine.add_argument("--out", required=True, help="run directory (model, results.json, predictions, checkpoints)")
    fine.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    fine.add_argument("--new-head", action="store_true",
                      help="replace a task head the model directory already has (another task's labels)")
    fine.add_argument("--quiet", action="store_true", help="no progress bar")
    fine.add_argument("--eval-file", action="append", metavar="FILE",
                      help="another labelled file in the dev file's format (a test set, CoLA's out-of-domain "
                           "sentences), scored at the end with the best epoch's model (repeat for several)")
    sweep = fine.add_argument_group("several runs and a result card (OUT/seedS/, OUT/card.json, card.md, card.png)")
    sweep.add_argument("--seeds", metavar="LIST",
                       help="one run per seed, e.g. 1,2,3,4,5 or 1-5, each in OUT/seedS; then the card: median, "
                            "mean, min-max and IQR of every metric")
    sweep.add_argument("--lr-grid", nargs="?", const="paper", metavar="LRS",
                       help="every seed at each of these learning rates (OUT/lrX/seedS); alone: the paper's "
                            "2e-5,3e-5,5e-5; the card reports the one with the best median dev metric")
    sweep.add_argument("--name", help="the card's row name in `bertkit card` tables (default: the model's)")
    _add_finetune_options(fine)
    fine.set_defaults(func=cmd_finetune)

    card = verbs.add_parser("card", help="merge result cards into one table and a dot-and-whisker PNG",
                            description="Read the cards of several sweeps (`bertkit finetune --seeds ...` "
                                        "directories, recomputed from their runs' results.json; a single run "
                                        "directory counts as a card of one run) and print one table: rows = "
                                        "models or variants (a sweep's --name, or NAME=DIR here), columns = task: "
                                        "metric, cells = median [q1, q3] (min-max, n). --out also writes "
                                        "card.json, card.md and card.png there.")
    card.add_argument("run_dirs", nargs="+", metavar="[NAME=]RUN_DIR", help="sweep or run directories")
    card.add_argument("--out", help="directory for card.json, card.md and card.png")
    card.add_argument("--metric", action="append",
                      help="metric key to show (repeat; e.g. mcc, out_of_domain_dev/mcc; default: each card's "
                           "selection metric, on dev and on its extra files)")
    card.set_defaults(func=cmd_card)

    ev = verbs.add_parser("evaluate", help="score a predictions file against a labelled data file",
                          description="Print the metrics (JSON) of a predictions file: SQuAD predictions.json (and "
                                      "null_odds.json) with the official scripts' keys; GLUE / classify: one label "
                                      "per line or a GLUE submission TSV; NER: CoNLL with the predicted tag last; "
                                      "SWAG: one ending index per line.")
    ev.add_argument("kind", choices=kinds, help="task family")
    ev.add_argument("--data", required=True, help="labelled data file (dev set)")
    ev.add_argument("--predictions", required=True, help="predictions file")
    ev.add_argument("--null-odds", help="SQuAD 2.0: null_odds.json (the official --na-prob-file)")
    ev.add_argument("--task", help="GLUE task name (glue only)")
    ev.add_argument("--text-column", default="text", help="classify: text column (default text)")
    ev.add_argument("--pair-column", help="classify: second-text column")
    ev.add_argument("--label-column", default="label", help="classify: label column (default label)")
    ev.add_argument("--regression", action="store_true", help="classify: numeric labels")
    ev.add_argument("--column", type=int, help="ner: the data file's tag column (default the last)")
    ev.add_argument("--scheme", default="auto", choices=("auto", "none"),
                    help="ner: auto (entity tags: entity F1) or none (plain tags such as POS: token accuracy)")
    _add_table_options(ev)
    ev.add_argument("--compact", action="store_true", help="JSON on one line")
    ev.set_defaults(func=cmd_evaluate)

    pr = verbs.add_parser("predict", help="predict with a fine-tuned model directory",
                          description="Labels with probabilities (classify), entity spans (ner), answers (squad) or "
                                      "the best ending (swag). --input: one input per line (fields separated by a "
                                      "tab: text, pair / question, context / context, choice, choice, ...) or JSON "
                                      "Lines with those keys (text, pair / question, context / context, choices).")
    pr.add_argument("kind", choices=[k for k in kinds if family_for(k).predicts_as is None], help="task family")
    pr.add_argument("--model", required=True, help="fine-tuned model directory")
    pr.add_argument("--text", help="text to classify or tag")
    pr.add_argument("--pair", help="second text of a pair (classify)")
    pr.add_argument("--question", help="question (squad)")
    pr.add_argument("--context", help="passage (squad) or context sentence (swag)")
    pr.add_argument("--choice", action="append", help="a candidate ending (swag; repeat for each)")
    pr.add_argument("--input", help="file of inputs (.txt/.tsv lines or .jsonl), or a table (.parquet, .arrow, "
                                    ".json records, .csv, a datasets directory) with columns named as the fields")
    _add_input_table_options(pr, pair=True)
    pr.add_argument("--top-k", type=int, help="labels (classify) or n-best answers (squad) to show")
    pr.add_argument("--batch-size", type=int, default=32, help="inputs per forward pass (default 32)")
    pr.add_argument("--max-seq-length", type=int, help="tokens per input (default: as fine-tuned)")
    pr.add_argument("--json", action="store_true", help="one JSON object per input")
    add_words_option(pr)
    pr.set_defaults(func=cmd_predict)

    feat = verbs.add_parser("features", help="per-token vectors from chosen hidden layers (feature-based BERT)",
                            description="Write each input line's per-token features (hidden states of --layers, "
                                        "combined) to .safetensors (tensors line_0, line_1, ...; tokens in the "
                                        "metadata), .npz (features (N, T, D) zero-padded, lengths, tokens) or .npy "
                                        "(the padded array; NAME.lengths.npy and NAME.tokens.json beside it).")
    feat.add_argument("--model", required=True, help="model directory (any head; the encoder is used)")
    feat.add_argument("--input", required=True, help="text file, one input per line; or a table (.parquet, .arrow, "
                                                     ".json records, .jsonl, .csv, a datasets directory), one "
                                                     "input per row")
    _add_input_table_options(feat)
    feat.add_argument("--out", required=True, help="output file: .safetensors, .npz or .npy")
    feat.add_argument("--layers", default="-1,-2,-3,-4",
                      help="comma-separated layer indices, 0 = embeddings, -1 = last (default -1,-2,-3,-4)")
    feat.add_argument("--combine", choices=["concat", "sum", "none"], default="concat",
                      help="how to combine the layers (default concat)")
    feat.add_argument("--batch-size", type=int, default=32, help="lines per forward pass (default 32)")
    feat.add_argument("--max-seq-length", type=int, help="truncate to this many tokens (default 512; sentence "
                                                         "vectors: the directory's sentence-transformers length)")
    feat.add_argument("--pooling", default="auto",
                      choices=["auto", "none", "cls", "mean", "max", "last", "weighted-mean", "mean-sqrt-len"],
                      help="one vector per line (N, D) pooled so; auto (default): a sentence-transformers "
                           "directory's own pooling (Dense, Normalize), per-token features otherwise; none: per-token")
    add_words_option(feat)
    feat.add_argument("--stateful", action="store_true",
                      help="ELMo: read the lines as one stream, --batch-size lines at a time in file order, each "
                           "LSTM state carried from a batch's row to the next batch's same row (bilm-tf's and "
                           "AllenNLP's way); default: every batch from zeros")
    feat.add_argument("--query-prompt", help="sentence vectors: text put before each line (the lines are queries)")
    feat.add_argument("--document-prompt", help="sentence vectors: text put before each line (documents)")
    feat.add_argument("--prompt-name", help="sentence vectors: put the directory's prompt of this name (query, "
                                            "document) before each line")
    feat.add_argument("--dimensions", type=int, help="sentence vectors: keep the first N components, renormalised "
                                                     "when the model normalises (Matryoshka models)")
    feat.add_argument("--window", type=int, help="sentence vectors of long lines: overlapping windows of N tokens "
                                                 "(special tokens included), pooled into one vector (the windows' "
                                                 "mean weighted by their tokens)")
    feat.add_argument("--stride", type=int, help="--window: text tokens between window starts (default: half)")
    feat.add_argument("--per-window", action="store_true",
                      help="--window: one vector per window, with its line (text) and character span (chars)")
    feat.set_defaults(func=cmd_features)

    sim = verbs.add_parser("similarity", help="one word's contextual vectors in several texts, compared layer by layer",
                           description="Print the cosine similarity of WORD's vectors (its first occurrence in each "
                                       "text, first token) between the texts, at every layer of the model (0 = "
                                       "embeddings, or ELMo's context-free token layer).")
    sim.add_argument("--model", required=True, help="model directory (any encoder; ELMo included)")
    sim.add_argument("--word", required=True, help="the word to compare, e.g. bank")
    sim.add_argument("texts", nargs="+", help="two or more texts containing the word")
    sim.add_argument("--max-seq-length", type=int, default=512, help="truncate to this many tokens (default 512)")
    sim.add_argument("--json", action="store_true", help="print the result as one JSON object")
    add_words_option(sim)
    sim.set_defaults(func=cmd_similarity)
    add_distill_parser(verbs)
    add_mine_parser(verbs)
    add_serve_parsers(verbs)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "takes_extra", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if getattr(args, "takes_extra", False):
            args.func(args, extra)
        else:
            args.func(args)
    except KeyboardInterrupt:
        print("bertkit: interrupted", file=sys.stderr)
        return 130
    except (OSError, ValueError, TypeError, KeyError, ArithmeticError, ImportError) as err:  # a diverged loss too
        if os.environ.get("BERTKIT_DEBUG"):
            raise
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"bertkit: error: {missing_extra(err, _verb_words(args, argv)) or message}", file=sys.stderr)
        return 2
    return 0


def _verb_words(args: argparse.Namespace, argv: list[str] | None) -> str:
    """What the user ran, for messages: "finetune ner", "export onnx", "serve"."""
    words = [args.verb]
    given = list(sys.argv[1:] if argv is None else argv)
    following = given[given.index(args.verb) + 1:] if args.verb in given else []
    sub = [getattr(args, k, None) for k in ("tverb", "format", "distill_kind", "analysis", "kind")]
    if following and following[0] in sub:
        words.append(following[0])
    return " ".join(words)


if __name__ == "__main__":
    sys.exit(main())
