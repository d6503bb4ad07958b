"""The model family x task kind matrix, cell by cell, from the complete cross product of
`bertkit.tasks.base.MATRIX_FAMILIES` and `MATRIX_KINDS`: a cell of `REFUSED` must be refused on the command line in
exactly one line with the table's reason; every other cell must work through the command line, and what it
writes must compute what transformers' matching class computes (logits within 1e-5; 1e-4 for onnxruntime).

    classify, glue (a sentence-pair task, MRPC), ner, squad, swag
        `bertkit finetune KIND` on a tiny random-weight model directory of the family; the fine-tuned directory
        loads in transformers' class for it (config.json's architecture, no missing or unexpected tensors) with
        the same logits on padded batches (a causal model: transformers' BertModel with is_decoder and GPT-1's
        extract-token head by hand, the class transformers would pick reading the pooled first token instead;
        T5: T5ForConditionalGeneration's decoder logits; ELMo: no transformers class, the directory reloads into
        the same outputs: every tensor the trainer's checkpoint holds, the pretraining directory's layers, the
        run's dev metrics and dev predictions file)
    predict    `bertkit predict classify --json` on the family's fine-tuned classifier: its probabilities are the
               softmax of transformers' logits for the same text (T5: the label transformers' greedy decoding
               writes)
    export     `bertkit export onnx` of the family's fine-tuned classifier: onnxruntime's logits equal
               transformers' (within 1e-4: another runtime's kernels)

docs/reference/family-matrix.md shows the table this test derives; `test_the_docs_page_is_the_table` keeps them
equal. Model directories, task files and fine-tuned runs are made once per module and shared by the cells.
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

import pytest
import torch

from bertkit.cli import main
from bertkit.tasks.base import MATRIX_FAMILIES, MATRIX_KINDS, REFUSED, TASK_OPTIONS, refusal

transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serve"))
from serve_models import WORDS, fixed_vocabulary  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
ATOL, ONNX_ATOL = 1e-5, 1e-4
FINETUNE_KINDS = ("classify", "glue", "ner", "squad", "swag")
# transformers' class name of a family's task model: family prefix + role suffix (config.json's architecture)
PREFIX = {"bert": "Bert", "roberta": "Roberta", "albert": "Albert", "electra": "Electra", "distilbert": "DistilBert",
          "causal": "Bert", "modernbert": "ModernBert", "xlnet": "XLNet"}
SUFFIX = {"classify": "ForSequenceClassification", "glue": "ForSequenceClassification",
          "ner": "ForTokenClassification", "squad": "ForQuestionAnswering", "swag": "ForMultipleChoice"}
# Cells whose transformers class reads another vector than bertkit's: a causal model's sentence heads read the
# last real token (GPT-1); transformers' BertFor... would pool the first, which a causal mask leaves blind.
BY_HAND = {("causal", "classify"), ("causal", "glue"), ("causal", "swag")}
FINETUNE = ["--epochs", "1", "--batch-size", "8", "--max-seq-length", "40", "--learning-rate", "1e-3", "--quiet"]
CELLS = [(family, kind) for family in MATRIX_FAMILIES for kind in MATRIX_KINDS]
# The onnxruntime cells take from seconds to tens of seconds each, most of it in torch.export: they run with
# -m slow; every head they export is exported in the quick run of tests/serve/test_export.py (the new ones too).


def run(*argv) -> None:
    code = main([str(a) for a in argv])
    assert code == 0, f"bertkit {' '.join(map(str, argv))} exited {code}"


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(n)]


# ------------------------------------------------------------------------------------------------------------------
# Model directories (random weights, hidden 32, 2 layers) and task files
# ------------------------------------------------------------------------------------------------------------------
def make_model(family: str, path: Path) -> Path:
    """A pretraining-style directory of `family` with random weights and a tokenizer of the family's kind."""
    from bertkit.config import BertConfig, ElmoConfig, ModernBertConfig, T5Config, XLNetConfig
    from bertkit.models import (BertForCausalLM, BertForMaskedLM, ElmoLanguageModel, ModernBertForMaskedLM,
                                T5ForConditionalGeneration, XLNetLMHeadModel)
    from bertkit.tokenizers import UnigramTokenizer, WordTokenizer

    torch.manual_seed(0)
    texts = sentences(60, 0)
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                 max_position_embeddings=64, initializer_range=0.2)
    if family == "t5":
        tokenizer = UnigramTokenizer.train(texts, vocab_size=100, show_progress=False, extra_ids=5)
        config = T5Config(vocab_size=tokenizer.vocab_size, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                          initializer_factor=5.0)
        model = T5ForConditionalGeneration(config)
    elif family == "xlnet":
        tokenizer = UnigramTokenizer.train(texts, vocab_size=100, show_progress=False, xlnet=True)
        model = XLNetLMHeadModel(XLNetConfig(vocab_size=tokenizer.vocab_size, d_model=32, n_layer=2, n_head=4,
                                             d_inner=48, mem_len=16, initializer_range=0.2))
    elif family == "elmo":
        tokenizer = WordTokenizer.train(texts, vocab_size=40, max_characters=10, show_progress=False)
        model = ElmoLanguageModel(ElmoConfig.preset("tiny", vocab_size=tokenizer.vocab_size,
                                                    char_vocab_size=tokenizer.char_vocab_size, max_characters=10))
    else:
        tokenizer = fixed_vocabulary()
        fields = dict(small, vocab_size=tokenizer.vocab_size)
        if family == "modernbert":
            model = ModernBertForMaskedLM(ModernBertConfig(
                **{**fields, "num_hidden_layers": 3, "global_attn_every_n_layers": 2, "local_attention": 8,
                   "pad_token_id": tokenizer.pad_id, "cls_token_id": tokenizer.cls_id, "sep_token_id": tokenizer.sep_id,
                   "bos_token_id": tokenizer.cls_id, "eos_token_id": tokenizer.sep_id}))
        elif family == "causal":
            model = BertForCausalLM(BertConfig(**fields, causal=True))
        elif family == "roberta":  # byte-level BPE, RoBERTa's framing (<s> A </s></s> B </s>, one token type)
            from bertkit.tokenizers import ByteLevelBPETokenizer

            tokenizer = ByteLevelBPETokenizer.train(texts, vocab_size=300, min_frequency=1, show_progress=False)
            model = BertForMaskedLM(BertConfig.for_family(
                "roberta", **{**fields, "vocab_size": tokenizer.vocab_size}, type_vocab_size=1,
                pad_token_id=tokenizer.pad_id, bos_token_id=tokenizer.cls_id, eos_token_id=tokenizer.sep_id))
        else:
            if family in ("albert", "electra"):
                fields.update(embedding_size=16)
            model = BertForMaskedLM(BertConfig.for_family(family, **fields))
    model.save_pretrained(path, tokenizer=tokenizer)
    return path


def write_tasks(root: Path) -> dict[str, Path]:
    """Tiny labelled files of every kind (16 examples), words of the fixed vocabulary."""
    rng = random.Random(1)
    rows = ["text,label"] + [f"{s} {'good' if i % 2 else 'bad'},{'pos' if i % 2 else 'neg'}"
                             for i, s in enumerate(sentences(16, 2))]
    (root / "classify.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    pairs = ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"] + [
        f"{i % 2}\t{i}\t{i + 100}\t{a}\t{b} {'good' if i % 2 else 'long'}"
        for i, (a, b) in enumerate(zip(sentences(16, 3), sentences(16, 4)))]
    (root / "mrpc.tsv").write_text("\n".join(pairs) + "\n", encoding="utf-8")
    people, places = ["john", "mary", "peter", "anna"], ["paris", "london", "berlin", "rome"]
    ner = [f"{rng.choice(people)} B-PER\nlives O\nin O\n{rng.choice(places)} B-LOC\n. O" for _ in range(16)]
    (root / "ner.txt").write_text("\n\n".join(ner) + "\n", encoding="utf-8")
    paragraphs = []
    for i in range(8):
        p, c = people[i % 4], places[(i * 3) % 4]
        context = f"{p} lives in {c} . the movie was good ."
        paragraphs.append({"context": context, "qas": [{"id": f"q{i}", "question": f"where does {p} live ?",
                                                        "answers": [{"text": c, "answer_start": context.index(c)}]}]})
    (root / "squad.json").write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}),
                                     encoding="utf-8")
    swag = ["video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label"]
    for i in range(16):
        p, c = people[i % 4], places[i % 4]
        endings = ",".join(f"lives in {places[(i + k) % 4]} ." for k in range(4))
        swag.append(f"v{i},{i},x,{p} is from {c} .,{p},gold,{endings},0")
    (root / "swag.csv").write_text("\n".join(swag) + "\n", encoding="utf-8")
    return {"classify": root / "classify.csv", "glue": root / "mrpc.tsv", "ner": root / "ner.txt",
            "squad": root / "squad.json", "swag": root / "swag.csv"}


def finetune_argv(family: str, kind: str, model: Path, data: dict[str, Path], out: Path) -> list:
    extra = ["--task", "mrpc"] if kind == "glue" else []
    if family == "elmo" and "frozen" in TASK_OPTIONS[kind]:  # ELMo's layers feed a task model on frozen features
        extra += ["--frozen"]
    return ["finetune", kind, "--model", model, "--train", data[kind], "--dev", data[kind], "--out", out, *extra,
            *FINETUNE]


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    """Lazily made and shared: model(family) -> its directory; tuned(family, kind) -> the fine-tuned directory."""
    root = tmp_path_factory.mktemp("matrix")
    data = write_tasks(root)
    models: dict[str, Path] = {}
    tuned: dict[tuple[str, str], Path] = {}

    def model(family: str) -> Path:
        if family not in models:
            models[family] = make_model(family, root / f"model-{family}")
        return models[family]

    def finetuned(family: str, kind: str) -> Path:
        if (family, kind) not in tuned:
            out = root / f"run-{family}-{kind}"
            run(*finetune_argv(family, kind, model(family), data, out))
            tuned[family, kind] = out / "model"
        return tuned[family, kind]

    class Matrix:
        pass

    m = Matrix()
    m.root, m.data, m.model, m.finetuned = root, data, model, finetuned
    return m


# ------------------------------------------------------------------------------------------------------------------
# Inputs and the reference logits
# ------------------------------------------------------------------------------------------------------------------
def padded_batch(config, kind: str, left: bool = False, seed: int = 0):
    """Three rows of random ids (ids from 10 up) of `config`'s vocabulary, real lengths 12, 8 and 5, padded with its
    pad id, both token types where it has two; (1, 3, T) as three choices of one example for swag."""
    vocab, pad = config.vocab_size, config.pad_token_id
    pairs = getattr(config, "type_vocab_size", 2) > 1
    g = torch.Generator().manual_seed(seed)
    T, lengths = 12, (12, 8, 5)
    ids = torch.randint(10, vocab, (3, T), generator=g)
    mask = torch.zeros(3, T, dtype=torch.long)
    types = torch.zeros(3, T, dtype=torch.long)
    for row, n in enumerate(lengths):
        real = slice(T - n, T) if left else slice(0, n)
        mask[row, real] = 1
        if pairs:
            types[row, real][n // 2:] = 1
    ids[mask == 0] = pad
    if kind == "swag":
        return ids[None], mask[None], types[None]
    return ids, mask, types


def ours_for(directory: Path, kind: str):
    from bertkit.tasks.finetune import load_predictor

    return load_predictor(directory, kind).model.eval()


def theirs_for(directory: Path):
    """transformers' class named by config.json's architecture, loaded with nothing missing or left over."""
    name = json.loads((directory / "config.json").read_text())["architectures"][0]
    model, info = getattr(transformers, name).from_pretrained(str(directory), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()


def by_hand(directory: Path, ids, mask, types):
    """A causal model's sentence head over transformers' BertModel (is_decoder: the causal mask): the last real
    token's vector -> the directory's classifier (GPT-1's extract token and W_y)."""
    from safetensors.torch import load_file

    encoder = transformers.BertModel.from_pretrained(str(directory), add_pooling_layer=False).eval()
    assert encoder.config.is_decoder
    shape = ids.shape
    flat = [t.reshape(-1, shape[-1]) for t in (ids, mask, types)]
    hidden = encoder(input_ids=flat[0], attention_mask=flat[1], token_type_ids=flat[2]).last_hidden_state
    last = flat[1].sum(-1) - 1  # right padding: the last real position
    vector = hidden[torch.arange(hidden.shape[0]), last]
    weights = load_file(str(directory / "model.safetensors"))
    logits = vector @ weights["classifier.weight"].T + weights["classifier.bias"]
    return logits.view(*shape[:-1], -1).squeeze(-1) if len(shape) == 3 else logits


def reference_logits(family: str, kind: str, directory: Path, ids, mask, types):
    with torch.no_grad():
        if (family, kind) in BY_HAND:
            return by_hand(directory, ids, mask, types)
        theirs = theirs_for(directory)
        inputs = {"input_ids": ids, "attention_mask": mask}
        if family not in ("distilbert", "modernbert"):
            inputs["token_type_ids"] = types
        out = theirs(**inputs)
        return torch.stack([out.start_logits, out.end_logits], -1) if kind == "squad" else out.logits


def assert_close(mine, theirs, mask, kind, atol=ATOL):
    if kind in ("ner", "squad"):  # per token: the real positions (bertkit leaves padding positions at 0)
        mine, theirs = mine[mask.bool()], theirs[mask.bool()]
    torch.testing.assert_close(mine, theirs, atol=atol, rtol=0)


# ------------------------------------------------------------------------------------------------------------------
# The cells
# ------------------------------------------------------------------------------------------------------------------
def refused_argv(matrix, family: str, kind: str) -> list:
    """The command line of a refused cell."""
    model = matrix.model(family)
    if kind == "export":
        source = model if family == "t5" else matrix.finetuned(family, "classify")
        return ["export", "onnx", "--model", source, "--out", matrix.root / f"{family}.onnx"]
    return finetune_argv(family, kind, model, matrix.data, matrix.root / f"refused-{family}-{kind}")


def check_finetuned(matrix, family: str, kind: str) -> None:
    directory = matrix.finetuned(family, kind)
    if family == "elmo":  # no transformers class: bertkit's own format, read back into the same outputs
        check_elmo_reloads(matrix, kind, directory)
        return
    if family == "t5":
        from bertkit.models import T5ForConditionalGeneration

        ours = T5ForConditionalGeneration.from_pretrained(directory).eval()
        theirs = theirs_for(directory)
        assert type(theirs).__name__ == "T5ForConditionalGeneration"
        ids, mask, _ = padded_batch(ours.config, "classify")
        target = ids[:, :4].clone()
        with torch.no_grad():
            mine = ours(ids, mask, decoder_input_ids=target).logits
            want = theirs(input_ids=ids, attention_mask=mask, decoder_input_ids=target).logits
        torch.testing.assert_close(mine, want, atol=ATOL, rtol=0)
        return
    architecture = json.loads((directory / "config.json").read_text())["architectures"][0]
    assert architecture.removesuffix("Simple") == PREFIX[family] + SUFFIX[kind], architecture
    ours = ours_for(directory, kind)
    config = ours.config
    ids, mask, types = padded_batch(config, kind, left=family == "xlnet")
    with torch.no_grad():
        mine = ours(ids, mask, types).logits
    assert_close(mine, reference_logits(family, kind, directory, ids, mask, types), mask, kind)


def check_elmo_reloads(matrix, kind: str, directory: Path) -> None:
    """The fine-tuned ELMo directory read back is the model the run held: every tensor equal to the trainer's own
    checkpoint of its last step (the one epoch is the best), its frozen encoder giving the pretraining directory's
    layers bit for bit, and its dev logits giving the run's best-epoch dev metrics and the very dev predictions
    file the run wrote."""
    from bertkit.checkpoint import load_checkpoint
    from bertkit.features import FeatureTaskModel, encoder_hidden_states, load_encoder
    from bertkit.tasks.run import FinetuneConfig, load_task_data, model_outputs

    model = FeatureTaskModel.from_pretrained(directory).eval()
    assert model.role == {"classify": "sequence", "glue": "sequence", "ner": "token", "squad": "qa"}[kind]
    run_dir = directory.parent
    results = json.loads((run_dir / "results.json").read_text(encoding="utf-8"))
    last, = sorted((run_dir / "checkpoints").glob("step-*.pt"))
    held = load_checkpoint(last)
    assert held["step"] == results["best"]["step"]
    reloaded = model.state_dict()
    assert set(reloaded) == set(held["model"])
    for name, tensor in held["model"].items():
        assert torch.equal(reloaded[name], tensor), name
    config = FinetuneConfig(**results["config"])
    data = load_task_data(kind, directory, matrix.data[kind], matrix.data[kind], config)
    # the encoder was frozen: the directory's ELMo is the pretraining directory's, layer for layer
    ids = torch.tensor([data.dev_features[0]["input_ids"]])
    with torch.no_grad():
        saved = encoder_hidden_states(load_encoder(directory).eval(), ids, torch.ones_like(ids),
                                      tokenizer=data.tokenizer)
        pretrained = encoder_hidden_states(load_encoder(matrix.model("elmo")).eval(), ids, torch.ones_like(ids),
                                           tokenizer=data.tokenizer)
    for a, b in zip(saved, pretrained):
        assert torch.equal(a, b)
    logits = model_outputs(data.family, model, data.dev_features, data.tokenizer.pad_id, config.eval_batch_size)
    metrics, output = data.family.evaluate(data.dev_examples, data.dev_features, logits)
    best = results["best"]
    compared = [name for name in data.family.metric_names if name in best and name in metrics]
    assert compared, (metrics, best)
    for name in compared:
        assert metrics[name] == pytest.approx(best[name], abs=1e-9), (name, metrics, best)
    again = matrix.root / f"rewritten-{kind}"
    again.mkdir(exist_ok=True)
    data.family.write_predictions(again, data.dev_examples, output)
    written = sorted(p.name for p in again.iterdir())
    assert written
    for name in written:
        assert (again / name).read_bytes() == (run_dir / name).read_bytes(), name


def check_predict(matrix, family: str, capsys) -> None:
    from bertkit.tokenizers import load_tokenizer

    directory = matrix.finetuned(family, "classify")
    text = "mary lives in rome and the movie was good"
    capsys.readouterr()
    run("predict", "classify", "--model", directory, "--text", text, "--json")
    answer = json.loads(capsys.readouterr().out)
    if family == "t5":  # text to text: what transformers' greedy decoding writes for the task's input text
        from bertkit.tasks.finetune import load_predictor

        predictor = load_predictor(directory)
        family_object = predictor.family()
        ids = torch.tensor([family_object.prediction_features([text], predictor.tokenizer)[0]["input_ids"]])
        with torch.no_grad():
            written = theirs_for(directory).generate(ids, do_sample=False, num_beams=1,
                                                     max_new_tokens=family_object.max_target_length)
        assert answer["text"] == predictor.tokenizer.decode(written[0].tolist(), skip_special_tokens=True), answer
        return
    probabilities = answer["probabilities"]
    assert set(probabilities) == {"neg", "pos"} and answer["label"] == max(probabilities, key=probabilities.get)
    if family == "elmo":  # no transformers class
        assert abs(sum(probabilities.values()) - 1) < 1e-6
        return
    tokenizer = load_tokenizer(directory)
    encoding = tokenizer.encode(text)
    ids, types = torch.tensor([encoding.input_ids]), torch.tensor([encoding.token_type_ids])
    logits = reference_logits(family, "classify", directory, ids, torch.ones_like(ids), types)
    want = dict(zip(theirs_for(directory).config.id2label.values(), torch.softmax(logits[0], -1).tolist()))
    for label, p in want.items():
        assert abs(probabilities[label] - p) <= ATOL, (label, probabilities, want)


def check_export(matrix, family: str, capsys) -> None:
    import numpy as np

    from bertkit.export import open_session

    directory = matrix.finetuned(family, "classify")
    path = matrix.root / f"{family}-classify.onnx"
    capsys.readouterr()
    run("export", "onnx", "--model", directory, "--out", path)
    assert json.loads(capsys.readouterr().out)["max_abs_diff"] <= ONNX_ATOL
    session = open_session(path, "classify")
    config = ours_for(directory, "classify").config
    ids, mask, types = padded_batch(config, "classify", seed=5)
    feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": types.numpy()}
    got = session.run(None, {i.name: feed[i.name] for i in session.get_inputs()})[0]
    want = reference_logits(family, "classify", directory, ids, mask, types).numpy()
    np.testing.assert_allclose(got, want, atol=ONNX_ATOL, rtol=0)


def _marks(family: str, kind: str):
    return [pytest.mark.slow] if kind == "export" and (family, kind) not in REFUSED else []


@pytest.mark.parametrize("family, kind", [pytest.param(f, k, marks=_marks(f, k), id=f"{f}-{k}") for f, k in CELLS])
def test_cell(family, kind, matrix, capsys):
    message = refusal(family, kind, "")
    if message is not None:
        capsys.readouterr()
        assert main([str(a) for a in refused_argv(matrix, family, kind)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and REFUSED[family, kind] in err, err
        return
    if kind in FINETUNE_KINDS:
        check_finetuned(matrix, family, kind)
    elif kind == "predict":
        check_predict(matrix, family, capsys)
    else:
        check_export(matrix, family, capsys)


def test_the_matrix_is_the_complete_cross_product():
    """Every refused cell is a cell of the matrix (a typo cannot refuse nothing), and every cell is tested."""
    assert set(REFUSED) <= set(CELLS)
    assert len(CELLS) == len(MATRIX_FAMILIES) * len(MATRIX_KINDS) == 70


# ------------------------------------------------------------------------------------------------------------------
# The docs page
# ------------------------------------------------------------------------------------------------------------------
DOCS = Path(__file__).resolve().parents[2] / "docs" / "reference" / "family-matrix.md"
def cell_text(family: str, kind: str) -> str:
    """What the docs table says of a cell: the reference bertkit's logits equal, or the refusal's note number."""
    if (family, kind) in REFUSED:
        return f"refused ({sorted(REFUSED).index((family, kind)) + 1})"
    if kind == "predict":
        return {"t5": "yes: transformers' greedy text", "elmo": "yes"}.get(family, "yes: softmax of the reference")
    if kind == "export":
        return "yes: onnxruntime = reference (1e-4)"
    if family == "elmo":
        return "yes, `--frozen` (no transformers class)"
    if family == "t5":
        return "T5ForConditionalGeneration (text to text)"
    if (family, kind) in BY_HAND:
        return "BertModel (is_decoder) + last-token head"
    return PREFIX[family] + SUFFIX[kind] + ("Simple" if (family, kind) == ("xlnet", "squad") else "")


def matrix_markdown() -> str:
    """The table and its refusal notes, as the docs page holds them between the markers."""
    lines = ["| family | " + " | ".join(MATRIX_KINDS) + " |", "|---" * (len(MATRIX_KINDS) + 1) + "|"]
    for family, label in MATRIX_FAMILIES.items():
        lines.append(f"| {label} | " + " | ".join(cell_text(family, kind) for kind in MATRIX_KINDS) + " |")
    lines.append("")
    for number, (family, kind) in enumerate(sorted(REFUSED), start=1):
        lines.append(f"{number}. {MATRIX_FAMILIES[family]} x {kind}: {REFUSED[family, kind]}.")
    return "\n".join(lines)


def test_the_docs_page_is_the_table():
    text = DOCS.read_text(encoding="utf-8")
    found = re.search(r"<!-- matrix: begin -->\n(.*?)\n<!-- matrix: end -->", text, re.S)
    assert found, f"{DOCS}: no matrix markers"
    assert found.group(1) == matrix_markdown(), (
        f"{DOCS} differs from the refusal table; put this between its markers:\n{matrix_markdown()}")
