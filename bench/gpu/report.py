"""report.md of the GPU suite: the environment, the correctness checks and the speed rows as Markdown tables.

The speed table has the columns of bench/README.md's GPU table, so its rows paste there as they are.
"""

from __future__ import annotations

SPEED_HEADER = ("| benchmark | T | batch | B | compile | bertkit | transformers | ratio (goal) | bertkit MFU (goal) "
                "| transformers MFU | bertkit / transformers peak step memory | command |")
SPEED_RULE = "|---|---|---|---|---|---|---|---|---|---|---|---|"


def command(name: str) -> str:
    """The command that measures one row again (the suite's --only takes an exact row name)."""
    return f"`bash bench/gpu/run.sh --only {name}`"


def markdown(env: dict, checks: list[dict], speed: list[dict], finished: bool) -> str:
    lines = [f"# bertkit GPU suite: {env.get('device_name')}", ""]
    if not finished:
        lines += ["**Run not finished**: these are the items done so far.", ""]
    lines += environment_table(env) + [""]
    lines += ["## Correctness", "", "| check | status | result | seconds |", "|---|---|---|---|"]
    for c in checks:
        detail = c.get("summary") or c.get("reason") or c.get("error") or ""
        lines.append(f"| {c['name']} | {c['status']} | {_cell(detail)} | {c['seconds']} |")
    lines += ["", "## Speed (bf16 autocast, both sides; ratio = bertkit / transformers)", "",
              f"Matmul peak (bf16, same run): {_peak(speed)}. MFU = model FLOPs (6N + 12LHT per real token in "
              "training, 2N + 4LHT in inference; bench/README.md) / step time / that peak. Peak step memory: "
              "`torch.cuda.max_memory_allocated` during one call beyond what was allocated before it.", "",
              SPEED_HEADER, SPEED_RULE]
    for r in speed:
        if r.get("bench") in (None, "peak") and r["status"] == "ok" or r["name"].startswith("e2e_"):
            continue
        lines.append(speed_row(r))
    lines += ["", *e2e_table([r for r in speed if r["name"].startswith("e2e_")]), ""]
    return "\n".join(lines)


def e2e_table(records: list[dict]) -> list[str]:
    """The end-to-end rows (bench/gpu/e2e.py): the CLI's rate against the Trainer's and the model step's."""
    lines = ["## End to end (the CLI against transformers' Trainer and bertkit's own model step)", "",
             "| row | model | bertkit | Trainer | ratio | model step | end to end / step | MFU |",
             "|---|---|---|---|---|---|---|---|"]
    for r in records:
        if r["status"] != "ok":
            lines.append(f"| {r['name']} | {r['status']}: {_cell(r.get('reason') or r.get('error') or '')} "
                         f"| | | | | | |")
            continue
        unit = "ex/s" if "bertkit_examples_per_s" in r else "tok/s"
        ours = r.get("bertkit_examples_per_s", r.get("bertkit_tokens_per_s"))
        peer = r.get("peer_examples_per_s", r.get("peer_tokens_per_s"))
        fmt = lambda x, spec: "" if x is None else format(x, spec)  # noqa: E731
        lines.append(f"| {r['name']} | {_cell(r.get('model', ''))} | {fmt(ours, ',.0f')} {unit} | "
                     f"{fmt(peer, ',.0f')} | {fmt(r.get('ratio'), '.2f')} | "
                     f"{fmt(r.get('model_step_tokens_per_s'), ',.0f')} | {fmt(r.get('ratio_to_step'), '.2f')} | "
                     f"{fmt(r.get('bertkit_mfu'), '.1%')} |")
    return lines


def environment_table(env: dict) -> list[str]:
    keys = [("device", "device_name"), ("GPUs", "gpu_count"), ("memory (GiB)", "gpu_memory_gib"),
            ("compute capability", "compute_capability"), ("driver", "driver"), ("CUDA (torch build)", "cuda"),
            ("cuDNN", "cudnn"), ("torch", "torch"), ("transformers", "transformers"), ("flash_attn", "flash_attn"),
            ("Python", "python"), ("CPU", "cpu"), ("bertkit commit", "bertkit_commit"), ("date", "date"),
            ("command", "command")]
    rows = ["| | |", "|---|---|"]
    rows += [f"| {label} | {_cell(str(env.get(key)))} |" for label, key in keys]
    return rows


def speed_row(r: dict) -> str:
    name = r["name"]
    if r["status"] != "ok":
        why = r.get("reason") or r.get("error") or ""
        return f"| {name} | | | | | {r['status']}: {_cell(why)} | | | | | | {command(name)} |"
    unit = "tok/s"
    model = r.get("model", "BERT-base")
    bench = {"pretrain_step": f"pretraining step, {model}", "inference": f"inference, {model}",
             "modernbert_inference": f"inference, {model}"}[r["bench"]]
    if r["bench"] == "modernbert_inference":
        bench += f" (transformers: {r.get('modernbert_attention')})"
    ratio = f"**{r['ratio']:.2f}**"
    if "goal_ratio" in r:
        ratio += f" (≥ {r['goal_ratio']}: {'met' if r['goal_ratio_met'] else 'not met'})"
    ours_mfu = f"{r['bertkit_mfu']:.2f}" if "bertkit_mfu" in r else ""
    if "goal_mfu" in r:
        ours_mfu += f" (≥ {r['goal_mfu']}: {'met' if r['goal_mfu_met'] else 'not met'})"
    peer_mfu = f"{r['transformers_mfu']:.2f}" if "transformers_mfu" in r else ""
    memory = (f"{_mib(r.get('bertkit_peak_step_mib'))} / {_mib(r.get('transformers_peak_step_mib'))}")
    compiled = r.get("compile_backend", "inductor") if r.get("compile") else "off"
    return (f"| {bench} | {r['seq_len']} | {r['batch']} | {r['batch_size']} | {compiled} | "
            f"{r['bertkit_tokens_per_s']:,.0f} {unit} | {r['transformers_tokens_per_s']:,.0f} {unit} | {ratio} | "
            f"{ours_mfu} | {peer_mfu} | {memory} | {command(name)} |")


def _peak(speed: list[dict]) -> str:
    for r in speed:
        if r.get("bench") == "peak" and r["status"] == "ok":
            return f"{r['peak_tflops']:.1f} TFLOP/s"
    return "not measured"


def _mib(value) -> str:
    return "n/a" if value is None else f"{value:,.0f} MiB"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:300]
