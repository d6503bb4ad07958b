"""The masked-LM objective indexes its masked positions with host-computed indices (no device read on a GPU):
the same loss and gradients, bit for bit, as boolean-mask indexing."""

import pytest
import torch
import torch.nn.functional as F

from bertkit import BertForPreTraining
from bertkit.models import IGNORE_INDEX
from bertkit.models.layouts import attach_host
from bertkit.training.objectives import MaskedLMObjective
from conftest import tiny_config
from device_reads import count_reads
from objective_rows import Case, cases, prepared, pretrain_args


def _batch(padded: bool) -> dict:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 120, (4, 12), generator=g)
    lengths = torch.tensor([12, 9, 5, 7]) if padded else torch.full((4,), 12)
    mask = (torch.arange(12)[None, :] < lengths[:, None]).long()
    labels = torch.where((torch.rand(4, 12, generator=g) < 0.3) & (mask != 0), ids, torch.full_like(ids, -100))
    labels[:, 1] = ids[:, 1]
    nsp = torch.tensor([0, 1, IGNORE_INDEX, 1])
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids), "labels": labels,
            "next_sentence_label": nsp}


def _reference(model, batch):
    """The objective as it was, with boolean-mask indexing (x[mask]): MLM at the labelled positions + NSP."""
    labels, pair = batch["labels"], batch["next_sentence_label"]
    at, keep = labels != IGNORE_INDEX, pair != IGNORE_INDEX
    out = model.bert.encode(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], False, False)
    if out.tokens is None:
        hidden = out.hidden[at]
    else:
        hidden = out.hidden[out.tokens.rows(at.reshape(-1).nonzero().squeeze(1))]
    logits = model.mlm(hidden)
    scores = model.nsp(model.bert.pooler(out.first()))[keep]
    return (F.cross_entropy(logits.float(), labels[at], reduction="sum")
            + F.cross_entropy(scores.float(), pair[keep], reduction="sum"))


@pytest.mark.parametrize("padded", [False, True])  # the padded layout, and the unpadded one (rows of other lengths)
@pytest.mark.parametrize("host_copies", [False, True])  # as moved by the trainer (host copies attached), or not
def test_index_select_equals_boolean_mask_indexing(padded, host_copies):
    torch.manual_seed(0)
    model = BertForPreTraining(tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    batch = _batch(padded)
    if host_copies:
        batch = {k: attach_host(v.clone(), v) for k, v in batch.items()}
    out = MaskedLMObjective("nsp", sparse_prediction=True)(model, batch)
    loss = out["mlm_loss"][0] + out["nsp_loss"][0]
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    expected = _reference(model, batch)
    expected.backward()
    assert torch.equal(loss, expected)
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, model.parameters()))
    assert out["mlm_loss"][1] == (batch["labels"] != IGNORE_INDEX).sum() and out["nsp_loss"][1] == 3


# ---- no device read between log steps, for every row of the objective table -----------------------------------
@pytest.fixture(scope="module")
def rows_root(tmp_path_factory):
    return tmp_path_factory.mktemp("objective-rows")


# MLM distillation reads a masked-LM row's stream (the teacher's tokenizer); its run is `bertkit distill mlm`
DISTILL = Case("distill-mlm", "roberta", "bert")


@pytest.mark.parametrize("case", [*cases(), DISTILL], ids=lambda case: case.id)
def test_no_device_reads_between_logs(case, rows_root, tmp_path, monkeypatch):
    # The row's own command line on a tiny model, 2 and 6 steps, one log line and one save at the end: every read
    # of a device value (a loss, a count, a mask's positions, a state copied to the host) that happened per step
    # would make the longer run read more. The batch plays the device's (the model's value checks off).
    from bertkit.cli import main
    from bertkit.models import layouts

    monkeypatch.setattr(layouts, "checks_values", lambda x: False)
    data = prepared(case, rows_root)

    def run(steps):
        args = pretrain_args(case, data, tmp_path / f"run{steps}", "--max-steps", str(steps), "--log-every", "1000",
                             "--save-every", "1000", "--batch-size", "4", "--workers", "0")
        if case is DISTILL:  # a 2-layer teacher into a 1-layer student of its config, on the same command line
            teacher = tmp_path / "teacher"
            if not teacher.is_dir():
                assert main(["init", "--tokenizer", str(next(rows_root.glob("tok-kind-wordpiece*"))), "--preset",
                             "tiny", "--out", str(teacher)]) == 0
            drop = {"--config", "--objective", "--preset", "--hidden-size", "--num-hidden-layers",
                    "--num-attention-heads", "--intermediate-size"}
            kept = [a for i, a in enumerate(args[1:], 1) if a not in drop and args[i - 1] not in drop]
            args = ["distill", "mlm", "--teacher", str(teacher), "--objective", "roberta", "--num-hidden-layers",
                    "1", *kept]
        def go():
            assert main(args) == 0

        return go

    short, long = [], []
    assert count_reads(run(2), monkeypatch, short) == count_reads(run(6), monkeypatch, long), (short, long)
