"""bertkit.pipeline.plan: the precision by the CPU's flags, the machine described, the budget split between
pretraining and the curve."""

from __future__ import annotations

import pytest

from bertkit.pipeline.plan import choose_precision, cpu_bf16_flags, describe_machine, plan_budget


def test_precision_follows_the_cpu_flags():
    line = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f {}\n"
    assert cpu_bf16_flags(line.format("avx512_bf16")) == ["avx512_bf16"]
    assert cpu_bf16_flags(line.format("amx_bf16 amx_tile avx512_bf16")) == ["amx_bf16", "avx512_bf16"]
    assert cpu_bf16_flags(line.format("")) == [] and cpu_bf16_flags("") == []
    assert choose_precision("cpu", line.format("avx512_bf16"))[0] == "bf16"
    precision, why = choose_precision("cpu", line.format("avx512_vnni"))
    assert precision == "fp32" and "no native bf16" in why
    assert choose_precision("cuda", line.format(""))[0] == "auto"
    machine = describe_machine(cpuinfo=line.format("avx512_bf16"))
    assert machine["flags"] == ["avx2", "avx512f", "avx512_bf16"] and machine["gpu"] is None
    assert "flags avx2 avx512f avx512_bf16; no GPU" in machine["summary"]


def test_plan_budget_splits_the_time():
    ladder = [32, 128, 512, 2770]  # passes 63, 16, 4, 3: about 2,000 examples a run, 8,310 for all
    # The default passes: at least FINETUNE_MIN_EXAMPLES (1,000) examples a run, 3 passes over a large set.
    assert plan_budget(1500.0, seeds=[1, 1, 1, 1], step_s=0.15, eval_row_s=0.0015, ladder=ladder, example_s=0.005,
                       fixed_s=1.0).passes == (32, 8, 3, 3)
    cost = dict(step_s=0.15, eval_row_s=0.0015, ladder=ladder, example_s=0.005, fixed_s=1.0, passes=[63, 16, 4, 3])
    run_s = [n * p * 0.005 + 1.0 for n, p in zip(ladder, (63, 16, 4, 3))]
    # Roomy: every seed; pretraining gets the rest, 30 evaluations of 500 rows.
    plan = plan_budget(1500.0, seeds=[5, 5, 3, 3], **cost)
    assert plan.seeds == (5, 5, 3, 3) and plan.passes == (63, 16, 4, 3) and plan.eval_rows == 500
    assert plan.run_s == pytest.approx(run_s)
    assert plan.finetune_s == pytest.approx(2 * sum(k * r for k, r in zip((5, 5, 3, 3), run_s)))
    assert plan.pretrain_s == pytest.approx(1500.0 - plan.finetune_s) and not plan.short
    assert plan.expected_steps == int((plan.pretrain_s - 30 * 500 * 0.0015) / 0.15)
    assert plan.eval_every == plan.expected_steps // 30
    # Tighter: the largest label counts lose seeds first, the smallest keeps its five longest.
    mid = plan_budget(600.0, seeds=[5, 5, 3, 3], **cost)
    assert mid.seeds == (5, 2, 1, 1) and mid.finetune_s <= 0.45 * 600.0
    # Tight: one seed everywhere is still too much, so the passes shrink (pretraining keeps its share).
    tight = plan_budget(300.0, seeds=[5, 5, 3, 3], **cost)
    assert tight.seeds == (1, 1, 1, 1) and tight.passes == (55, 14, 3, 2)  # x (135 - 8) / 144.2
    assert tight.finetune_s <= 0.45 * 300.0 and tight.pretrain_s == pytest.approx(300.0 - tight.finetune_s)
    starved = plan_budget(100.0, seeds=[5, 5, 3, 3], **cost)  # even one pass each is over the share
    assert starved.passes == (16, 4, 1, 1) and starved.pretrain_s == pytest.approx(55.0)  # not 100 - 51
    floor = plan_budget(20.0, seeds=[5, 5, 3, 3], **cost)
    assert floor.seeds == (1, 1, 1, 1) and floor.passes == (1, 1, 1, 1) and floor.short and floor.pretrain_s == 30.0
    # A slow machine: evaluations shrink to keep within 12% of pretraining (not below 64 rows).
    slow = plan_budget(540.0, seeds=[1, 1, 1, 1], **{**cost, "step_s": 3.5, "eval_row_s": 0.06})
    assert slow.eval_rows == 64
    # A fixed pretraining time: every seed and pass, whatever they cost.
    fixed = plan_budget(0.0, seeds=[2, 2, 2, 2], pretrain_s=3.0, **{**cost, "example_s": 60.0})
    assert (fixed.pretrain_s, fixed.seeds, fixed.passes, fixed.short) == (3.0, (2, 2, 2, 2), (63, 16, 4, 3), False)
    # A cost per example and a fixed cost for each label count (a frozen encoder's rungs: one pass, forward only).
    per_rung = plan_budget(1500.0, seeds=[5, 5, 3, 3], **{**cost, "example_s": [0.0001, 0.005, 0.005, 0.005],
                                                           "fixed_s": [0.5, 1.0, 1.0, 1.0]})
    assert per_rung.run_s == pytest.approx([32 * 63 * 0.0001 + 0.5] + run_s[1:])
    assert per_rung.pretrain_s == pytest.approx(plan.pretrain_s + 10 * (run_s[0] - per_rung.run_s[0]))
    tight_rungs = plan_budget(300.0, seeds=[1, 1, 1, 1], **{**cost, "fixed_s": [0.5, 1.0, 1.0, 2.0]})
    assert tight_rungs.passes == (55, 13, 3, 2)  # the training part x (135 - 9) / (153.22 - 9): fixed costs kept
    # The baseline's entries after the curve's: one starting point each (starts 1), the first seeds cut.
    arms = {**cost, "ladder": ladder + [32, 128], "passes": [63, 16, 4, 3, 32, 8], "starts": [2, 2, 2, 2, 1, 1]}
    both = plan_budget(1500.0, seeds=[5, 5, 3, 3, 3, 3], **arms)
    arm_s = [n * p * 0.005 + 1.0 for n, p in zip(arms["ladder"], arms["passes"])]
    assert both.starts == (2, 2, 2, 2, 1, 1) and both.seeds == (5, 5, 3, 3, 3, 3)
    assert both.finetune_s == pytest.approx(sum(k * m * r for k, m, r in zip(both.seeds, both.starts, arm_s)))
    assert both.finetune_s == pytest.approx(plan.finetune_s + 3 * (arm_s[4] + arm_s[5]))
    # Cut in stages: the baseline's entries but the smallest count's (to none), the curve's but the smallest
    # count's (to one), the curve's smallest count (to min_first_seeds), the baseline's smallest count (to one).
    cut = plan_budget(600.0, seeds=[5, 5, 3, 3, 3, 3], **arms)
    assert cut.seeds == (5, 1, 1, 1, 3, 0) and cut.finetune_s <= 0.45 * 600.0
    assert 2 * sum(k * r for k, r in zip((5, 2, 1, 1), arm_s)) + 3 * arm_s[4] > 0.45 * 600.0  # one more: over
    # Tighter: the curve's smallest count at 3, the baseline's at 1, then the smallest count below 3.
    assert plan_budget(450.0, seeds=[5, 5, 3, 3, 3, 3], **arms).seeds == (2, 1, 1, 1, 1, 0)
    assert plan_budget(400.0, seeds=[5, 5, 3, 3, 3, 3], **arms).seeds == (1, 1, 1, 1, 1, 0)
    assert plan_budget(100.0, seeds=[1, 1, 1, 1], **cost).starts == (2, 2, 2, 2)  # default: both starting points
    with pytest.raises(ValueError):
        plan_budget(100.0, seeds=[1, 1, 1, 1], **{**cost, "starts": [2, 2, 3, 2]})
    with pytest.raises(ValueError):
        plan_budget(100.0, seeds=[1, 1, 1, 1], **{**cost, "starts": [2, 2, 2]})
    with pytest.raises(ValueError):
        plan_budget(100.0, seeds=[1, 1, 1, 1], **{**cost, "step_s": 0.0})
    with pytest.raises(ValueError):
        plan_budget(100.0, seeds=[1, 1, 1, 1], **{**cost, "example_s": [0.005, 0.005]})  # one per label count
    with pytest.raises(ValueError):
        plan_budget(100.0, seeds=[1, 1, 1, 1], **{**cost, "fixed_s": [1.0, 1.0, 1.0]})
