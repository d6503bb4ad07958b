"""The whole pipeline in one call: corpus -> WordPiece vocabulary -> shards -> pretraining -> report.

`bertkit pipeline` is the README's first command. Given no corpus it assembles one at run time from text already
on the machine: the docstrings of the Python standard library and the installed packages, read with `ast` from
the source files (nothing is imported or executed). Nothing of that text ships with bertkit.
"""

from __future__ import annotations

import ast
import json
import os
import sysconfig
import time
from pathlib import Path
from typing import Any

DEFAULT_PROBES = [
    "return the [MASK] of the list.",
    "raise an [MASK] if the file does not exist.",
    "this function returns a new [MASK].",
    "the default [MASK] is none.",
]


def _docstrings(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError, OSError, RecursionError):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=True)
            if doc and len(doc) > 40:
                found.append(doc)
    return found


def default_corpus(out_file: Path, max_bytes: int = 12_000_000, progress: bool = True) -> Path:
    """Write docstrings of installed Python sources as a Google-format corpus: one paragraph per line, one
    module per document (blank line between documents). Stops at about `max_bytes`."""
    from bertkit.data.corpus import split_sentences

    roots = []
    for key in ("stdlib", "purelib", "platlib"):
        root = sysconfig.get_paths().get(key)
        if root and Path(root).is_dir() and root not in roots:
            roots.append(root)
    skip = {"test", "tests", "__pycache__", "site-packages", "dist-packages"}  # packages are walked as own roots
    files = []
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in skip and not d.startswith("."))
            files.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    written = documents = 0
    out_file.parent.mkdir(parents=True, exist_ok=True)
    from tqdm.auto import tqdm

    with open(out_file, "w", encoding="utf-8") as handle, tqdm(total=max_bytes, unit="B", unit_scale=True,
                                                               desc="assembling corpus", disable=not progress) as bar:
        for path in files:
            lines = []
            for doc in _docstrings(path):
                for paragraph in doc.split("\n\n"):
                    text = " ".join(paragraph.split())
                    # Prose only: skip doctest examples, parameter tables and code-like fragments.
                    if len(text) < 30 or ">>>" in text or text.count("_") > 4 or text.count("`") > 6:
                        continue
                    lines.extend(s for s in split_sentences(text) if len(s) > 15)
            if len(lines) < 2:
                continue
            block = "\n".join(lines) + "\n\n"
            handle.write(block)
            size = len(block.encode("utf-8"))
            written += size
            documents += 1
            bar.update(size)
            if written >= max_bytes:
                break
    if documents < 2:
        raise RuntimeError("could not find enough Python docstrings on this machine; pass --corpus PATH")
    return out_file


def run_pipeline(out_dir: str | Path = "runs/pipeline", corpus: list[str] | None = None, minutes: float = 10.0,
                 preset: str = "mini", vocab_size: int = 8192, probes: list[str] | None = None,
                 progress: bool = True, seed: int = 0, train_seconds: float | None = None) -> dict[str, Any]:
    """Run everything and return (and write to OUT/report.json) the report.

    minutes: the whole run's budget; pretraining gets what the other stages leave, at least a minute.
    train_seconds: the pretraining budget in seconds instead (smoke tests and quick looks).
    """
    from bertkit.data.corpus import iter_lines
    from bertkit.data.prepare import prepare
    from bertkit.inference import fill_mask
    from bertkit.pretrain import pretrain, resolve_config
    from bertkit.tokenizers import WordPieceTokenizer

    started = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    say = print if progress else (lambda *a, **k: None)

    if corpus:
        paths = list(corpus)
        say(f"1/5 corpus: {', '.join(paths)}")
    else:
        target = out / "corpus" / "docstrings.txt"
        if not target.is_file():
            say("1/5 corpus: assembling docstrings of the installed Python sources (parsed, not imported)")
            default_corpus(target, progress=progress)
        else:
            say(f"1/5 corpus: reusing {target}")
        paths = [str(target)]

    tok_dir = out / "tokenizer"
    if (tok_dir / "vocab.txt").is_file():
        say(f"2/5 vocabulary: reusing {tok_dir}")
        tokenizer = WordPieceTokenizer.from_pretrained(tok_dir)
    else:
        say(f"2/5 vocabulary: training a {vocab_size}-token uncased WordPiece vocabulary")
        tokenizer = WordPieceTokenizer.train(iter_lines(paths), vocab_size=vocab_size, show_progress=progress)
        tokenizer.save(tok_dir)

    say("3/5 shards: tokenising into memory-mapped shards (2% of documents held out)")
    data_dir = out / "data"
    manifest = prepare(paths, tok_dir, data_dir, eval_fraction=0.02, progress=progress, seed=seed)

    budget = train_seconds if train_seconds is not None else max(
        60.0, minutes * 60.0 - (time.perf_counter() - started) - 30.0)
    say(f"4/5 pretraining a {preset} BERT for {budget / 60:.1f} minutes (MLM + NSP)")
    config = resolve_config(preset if preset in ("tiny", "mini") else "mini",
                            {"preset": preset, "max_time": budget, "seed": seed, "progress": progress,
                             "eval_every": 0})
    run_dir = out / "run"
    result = pretrain(data_dir, run_dir, config, eval_at_start=True)
    evals = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if "eval_mlm_accuracy" in line]

    say("5/5 report: fill-mask and plots")
    predictions = {}
    for text in probes or DEFAULT_PROBES:
        found = fill_mask(run_dir / "model", text, top_k=5)
        predictions[text] = [(c["token"], round(c["probability"], 3)) for c in found[0]]
    plots = []
    try:
        from bertkit.plots import plot_run

        plots = [str(p) for p in plot_run(run_dir)]
    except ImportError as err:
        say(f"   (no plots: {err})")

    report = {
        "corpus": paths,
        "tokens": manifest.summary().get("splits", {}).get("train", {}).get("tokens")
        if hasattr(manifest, "summary") else None,
        "vocab_size": tokenizer.vocab_size,
        "steps": result.step,
        "train_tokens": result.tokens,
        "tokens_per_s": round(result.tokens / max(result.elapsed, 1e-9), 1),
        "mlm_accuracy_before": evals[0].get("eval_mlm_accuracy") if evals else None,
        "mlm_accuracy_after": evals[-1].get("eval_mlm_accuracy") if evals else None,
        "nsp_accuracy_after": evals[-1].get("eval_nsp_accuracy") if evals else None,
        "fill_mask": predictions,
        "plots": plots,
        "model": str(run_dir / "model"),
        "minutes": round((time.perf_counter() - started) / 60, 2),
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if progress:
        print()
        print(f"masked-token accuracy on held-out text: {report['mlm_accuracy_before']:.3f} before, "
              f"{report['mlm_accuracy_after']:.3f} after {result.step} steps "
              f"({report['tokens_per_s']:.0f} tokens/s); NSP accuracy {report['nsp_accuracy_after']:.3f}")
        for text, cands in predictions.items():
            print(f"  {text}\n      " + "  ".join(f"{t} ({p:.2f})" for t, p in cands))
        print(f"model directory: {report['model']}   plots: {run_dir / 'plots'}   report: {out / 'report.json'}")
    return report
