"""The table of `objectives.sh`: one row per pretraining run, read from what `bertkit pretrain` wrote.

    python bench/experiments/objectives_table.py OUT [NAME ...]      # NAME: run-NAME directories (default: all)

Each run directory holds config.yaml (the resolved recipe), metrics.jsonl (one training record per step, as
objectives.sh runs with --log-every 1, and the held-out evaluations before the first step and at the end) and
result.json. Prints a markdown table and writes it, with the numbers as JSON, to OUT/objectives.md and .json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

# objective -> (what is masked / predicted, pair task)
DESCRIPTIONS = {
    "bert": ("15% of tokens picked (80% [MASK], 10% random, 10% kept) and predicted; sentence pairs", "NSP"),
    "roberta": ("as BERT; rows packed FULL-SENTENCES across documents", "none"),
    "roberta-doc": ("as BERT; rows packed DOC-SENTENCES", "none"),
    "albert": ("as BERT; sentence pairs", "SOP"),
    "electra": ("generator: 15% masked and predicted (MLM); discriminator: every token, original or replaced by "
                "a generator sample", "none"),
    "causal": ("nothing masked; every next token predicted from the tokens before it", "none"),
}


def read_run(run: Path) -> dict:
    """The figures of one run directory."""
    config = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
               if line.strip()]
    train = [r for r in records if "loss" in r]
    evals = [r for r in records if any(k.startswith("eval_") for k in r)]
    if not train:
        raise SystemExit(f"{run}: no training step was logged (was the time budget shorter than one step?)")
    # Throughput over steps 2.. (step 1's window also holds the evaluation before training and the warm-up).
    # Each record covers one step: its tokens over its tokens/s is the step's duration.
    timed = [(b["tokens"] - a["tokens"], (b["tokens"] - a["tokens"]) / b["tokens_per_s"])
             for a, b in zip(train, train[1:]) if b["step"] == a["step"] + 1 and b["tokens_per_s"] > 0]
    tokens_per_s = (sum(t for t, _ in timed) / sum(s for _, s in timed)) if timed else None
    k = max(1, min(10, len(train) // 10))  # losses averaged over the first and last k steps
    first = sum(r["loss"] for r in train[:k]) / k
    last = sum(r["loss"] for r in train[-k:]) / k
    tokenizer = json.loads((Path(config["data_dir"]) / "manifest.json").read_text(encoding="utf-8"))["tokenizer"]
    return {"name": run.name.removeprefix("run-"), "objective": config["data"]["objective"],
            "vocabulary": f"{tokenizer.get('kind', 'wordpiece')} {tokenizer['vocab_size']:,}",
            "model_type": config["model_config"].get("model_type", "bert"), "preset": config["preset"],
            "layers": config["model_config"]["num_hidden_layers"], "hidden": config["model_config"]["hidden_size"],
            "generator_hidden": int(config["model_config"]["hidden_size"] * config["data"]["generator_fraction"]),
            "max_seq_length": config["data"]["max_seq_length"], "masking": config["data"]["masking"], "batch_size": config["global_batch_size"],
            "parameters": count_parameters(config), "steps": train[-1]["step"], "tokens": train[-1]["tokens"],
            "tokens_per_s": tokens_per_s, "loss_first": first, "loss_last": last, "loss_window": k,
            "eval_before": evals[0] if evals and evals[0]["step"] == 0 else {},
            "eval_after": evals[-1] if evals else {}}


def count_parameters(config: dict) -> int:
    """Distinct trained parameters of the run's model (ELECTRA: generator and discriminator, embeddings shared)."""
    from bertkit.config import BertConfig
    from bertkit.training.objectives import build_pretraining

    model_config = BertConfig.from_dict(config["model_config"])
    data = config["data"]
    model, _ = build_pretraining(data["objective"], model_config, rtd_weight=data["rtd_weight"],
                                 generator_fraction=data["generator_fraction"])
    return model.num_parameters()


def held_out(row: dict) -> tuple[str, str]:
    """(main held-out accuracy, before -> after; the pair task's accuracy or other figures)."""
    before, after = row["eval_before"], row["eval_after"]

    def change(key: str) -> str:
        if key not in after:
            return "n/a"
        return (f"{before[key]:.3f} → {after[key]:.3f}" if key in before else f"{after[key]:.3f}")

    objective = row["objective"]
    if objective == "electra":
        majority = 1.0 - after.get("eval_replaced_fraction", float("nan"))
        return (f"RTD {change('eval_rtd_accuracy')}",
                f"generator MLM {change('eval_mlm_accuracy')}; all-original baseline {majority:.3f}")
    if objective == "causal":
        return f"next token {change('eval_lm_accuracy')}", f"perplexity {after.get('eval_perplexity', float('nan')):.0f}"
    pair = DESCRIPTIONS.get(objective, ("", "none"))[1].lower()
    other = f"{pair.upper()} {change(f'eval_{pair}_accuracy')}" if pair != "none" else "–"
    return f"MLM {change('eval_mlm_accuracy')}", f"{other}; perplexity {after.get('eval_perplexity', float('nan')):.0f}"


def table(rows: list[dict]) -> str:
    head = ("| run | model | vocabulary | masked / predicted | pair task | parameters | steps | real tokens/s "
            "| training loss, first → last | held-out accuracy, before → after | other held-out |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for row in rows:
        what, pair = DESCRIPTIONS.get(row["objective"], ("?", "?"))
        main, other = held_out(row)
        rate = "n/a" if row["tokens_per_s"] is None else f"{row['tokens_per_s']:,.0f}"
        model = f"{row['model_type']} L{row['layers']} H{row['hidden']}"
        if row["objective"] == "causal":
            model += ", causal mask"
        elif row["objective"] == "electra":
            model += f" + generator H{row['generator_hidden']}"
        lines.append(f"| {row['name']} | {model} | {row['vocabulary']} "
                     f"| {what} | {pair} | {row['parameters'] / 1e6:.2f}M | {row['steps']:,} | {rate} "
                     f"| {row['loss_first']:.3f} → {row['loss_last']:.3f} | {main} | {other} |")
    windows = sorted({row["loss_window"] for row in rows})
    lines.append("")
    masking = sorted({row["masking"] for row in rows})
    lines.append(f"Masks: {' and '.join(masking)} masking (drawn afresh every time a row is used when dynamic). "
                 f"Training loss: the mean over the first and the last {'/'.join(map(str, windows))} steps (the "
                 f"objective's total: ELECTRA's is generator MLM + 50 x discriminator BCE). Real tokens/s: "
                 f"non-padding tokens per second of training steps, the first step (which holds the evaluation "
                 f"before training) left out (n/a for a run of one step). Accuracies and perplexities compare "
                 f"only between runs on the same vocabulary.")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__)
    out = Path(argv[0])
    runs = [out / f"run-{name}" for name in argv[1:]] or sorted(out.glob("run-*"))
    rows = [read_run(run) for run in runs if (run / "metrics.jsonl").is_file()]
    text = table(rows)
    print(text)
    (out / "objectives.md").write_text(text + "\n", encoding="utf-8")
    (out / "objectives.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])
