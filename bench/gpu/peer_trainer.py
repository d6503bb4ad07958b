"""The peer of the end-to-end rows: transformers' `Trainer` on run_mlm.py's and run_glue.py's recipes.

A reference, not part of bertkit: the same text as bertkit's run (the token ids of its prepared shards, or the
SST-2 file), the recipes' settings: MLM (run_mlm.py): every line tokenised with [CLS] ... [SEP], concatenated and
cut into blocks of --seq-len (`group_texts`), `DataCollatorForLanguageModeling` at 15% into `BertForMaskedLM`
(--model modernbert: at 30% into `ModernBertForMaskedLM`, ModernBERT's rate); GLUE (run_glue.py): sentences padded
to --seq-len (`pad_to_max_length`), `BertForSequenceClassification`; T5: the span-corruption instances of bertkit's
stream (made before the clock starts) into `T5ForConditionalGeneration`. All: 4 dataloader workers, fused AdamW,
bf16 on a GPU, a model of the given preset from random initialisation.

Prints one JSON line: real tokens (MLM) or examples (GLUE) per second over the steps after the first `--warmup`.

    python bench/gpu/peer_trainer.py mlm --data DIR --preset base --seq-len 128 --batch-size 256 --steps 30
    python bench/gpu/peer_trainer.py glue --train SST-2/train.tsv --vocab vocab.txt --preset base --steps 30
    python bench/gpu/peer_trainer.py t5 --data DIR --preset base --seq-len 512 --batch-size 128 --steps 30
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


class Timer:
    """A TrainerCallback-like clock: the time and the step at the end of step `warmup` and at the last one."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.marks = warmup, {}

    def callback(self):
        from transformers import TrainerCallback

        timer = self

        class Clock(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                timer.marks[state.global_step] = time.perf_counter()

        return Clock()

    def seconds(self, last: int) -> float:
        return self.marks[last] - self.marks[self.warmup]


def bert_config(preset: str, vocab_size: int, seq_len: int):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    from bertkit.config import BertConfig
    from transformers import BertConfig as HFConfig

    ours = BertConfig.preset(preset) if hasattr(BertConfig, "preset") else None
    fields = {}
    if ours is not None:
        fields = {k: getattr(ours, k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                 "intermediate_size")}
    return HFConfig(vocab_size=vocab_size, max_position_embeddings=max(512, seq_len), **fields)


def training_args(out: str, args, steps: int):
    from transformers import TrainingArguments

    cuda = torch.cuda.is_available()
    return TrainingArguments(output_dir=out, per_device_train_batch_size=args.batch_size, max_steps=steps,
                             learning_rate=1e-4, warmup_steps=0, weight_decay=0.01, logging_steps=10 ** 9,
                             save_strategy="no", report_to=[], bf16=cuda, optim="adamw_torch_fused" if cuda
                             else "adamw_torch", dataloader_num_workers=args.workers,
                             dataloader_pin_memory=cuda, disable_tqdm=True, seed=0, use_cpu=not cuda)


def mlm(args) -> dict:
    from transformers import BertForMaskedLM, DataCollatorForLanguageModeling, Trainer

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    from bertkit.data.shards import ShardedCorpus

    corpus = ShardedCorpus(args.data, "train")
    tok = corpus.manifest.load_tokenizer()
    pieces = []
    for i in range(len(corpus)):  # run_mlm: each line with its specials, then group_texts
        for sentence in corpus.document(i)[0]:
            pieces.append(np.concatenate([[tok.cls_id], sentence, [tok.sep_id]]))
    stream = np.concatenate(pieces)
    blocks = torch.from_numpy(stream[:len(stream) // args.seq_len * args.seq_len].reshape(-1, args.seq_len))

    class Blocks(torch.utils.data.Dataset):
        def __len__(self):
            return len(blocks)

        def __getitem__(self, i):
            return {"input_ids": blocks[i]}

    class Vocab:  # what the collator asks of a tokenizer
        mask_token, pad_token = "[MASK]", "[PAD]"
        mask_token_id, pad_token_id = tok.mask_id, tok.pad_id

        def __len__(self):
            return tok.vocab_size

        def get_special_tokens_mask(self, ids, already_has_special_tokens=True):
            return [int(i in (tok.cls_id, tok.sep_id, tok.pad_id)) for i in ids]

        def convert_tokens_to_ids(self, token):
            return tok.mask_id

        def pad(self, examples, return_tensors="pt", **kwargs):
            return {"input_ids": torch.stack([e["input_ids"] for e in examples])}

    if args.model == "modernbert":  # ModernBERT's recipe: its masked LM at 30% masking
        model, probability = modernbert_masked_lm(args.preset, tok, args.seq_len), 0.3
    else:
        model, probability = BertForMaskedLM(bert_config(args.preset, tok.vocab_size, args.seq_len)), 0.15
    timer = Timer(args.warmup)
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(model=model, args=training_args(out, args, args.steps), train_dataset=Blocks(),
                          data_collator=DataCollatorForLanguageModeling(Vocab(), mlm_probability=probability),
                          callbacks=[timer.callback()])
        trainer.train()
    tokens = (args.steps - args.warmup) * args.batch_size * args.seq_len
    return {"peer": f"transformers Trainer (run_mlm.py recipe, {type(model).__name__})",
            "tokens_per_s": tokens / timer.seconds(args.steps)}


def modernbert_masked_lm(preset: str, tok, seq_len: int):
    """transformers' ModernBertForMaskedLM of bertkit's ModernBERT `preset` sizes, from random initialisation."""
    from bertkit.config import ModernBertConfig
    from transformers import ModernBertConfig as HFConfig, ModernBertForMaskedLM

    ours = ModernBertConfig.preset(preset)
    return ModernBertForMaskedLM(HFConfig(
        vocab_size=tok.vocab_size, hidden_size=ours.hidden_size, num_hidden_layers=ours.num_hidden_layers,
        num_attention_heads=ours.num_attention_heads, intermediate_size=ours.intermediate_size,
        max_position_embeddings=max(seq_len, 512), pad_token_id=tok.pad_id, cls_token_id=tok.cls_id,
        sep_token_id=tok.sep_id, bos_token_id=tok.cls_id, eos_token_id=tok.sep_id))


def t5(args) -> dict:
    """T5's span corruption: the same instances bertkit's stream makes (corrupted inputs, targets), made before the
    clock starts, into `T5ForConditionalGeneration` of bertkit's T5 `preset` sizes through the Trainer."""
    from transformers import T5Config as HFConfig, T5ForConditionalGeneration, Trainer

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    from bertkit.config import T5Config
    from bertkit.data.instances import SpecialIds
    from bertkit.data.loader import PretrainingStream
    from bertkit.data.shards import ShardedCorpus
    from bertkit.training.pretrain import resolve_config, stream_options

    corpus = ShardedCorpus(args.data, "train")
    tok = corpus.manifest.load_tokenizer()
    data = resolve_config("t5-base", {"preset": args.preset, "max_seq_length": args.seq_len}).data
    stream = iter(PretrainingStream(corpus, stream_options(data, tok), SpecialIds(cls=None, sep=tok.sep_id,
                                    pad=tok.pad_id, mask=None), tok.vocab_size, args.batch_size, prefetch=0))
    rows = []
    while len(rows) < args.steps * args.batch_size:
        batch = next(stream)
        for i in range(batch["input_ids"].shape[0]):
            rows.append({k: batch[k][i] for k in ("input_ids", "attention_mask", "labels")})
    widths = {k: max(r[k].numel() for r in rows) for k in rows[0]}  # one width per field (the collator stacks)
    fills = {"input_ids": tok.pad_id, "attention_mask": 0, "labels": -100}
    rows = [{k: torch.nn.functional.pad(v, (0, widths[k] - v.numel()), value=fills[k]) for k, v in r.items()}
            for r in rows]

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return len(rows)

        def __getitem__(self, i):
            return rows[i]

    ours = T5Config.preset(args.preset)
    model = T5ForConditionalGeneration(HFConfig(
        vocab_size=tok.vocab_size, d_model=ours.d_model, d_kv=ours.d_kv, d_ff=ours.d_ff, num_layers=ours.num_layers,
        num_heads=ours.num_heads, pad_token_id=tok.pad_id, eos_token_id=tok.sep_id,
        decoder_start_token_id=tok.pad_id))
    timer = Timer(args.warmup)
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(model=model, args=training_args(out, args, args.steps), train_dataset=Rows(),
                          callbacks=[timer.callback()])
        trainer.train()
    real = sum(int(r["attention_mask"].sum()) for r in rows[args.warmup * args.batch_size:])
    return {"peer": "transformers Trainer (T5ForConditionalGeneration, span corruption)",
            "tokens_per_s": real / timer.seconds(args.steps)}


def glue(args) -> dict:
    from transformers import BertForSequenceClassification, Trainer

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    from bertkit.tokenizers.load import load_tokenizer

    tok = load_tokenizer(args.vocab)
    lines = Path(args.train).read_text(encoding="utf-8").splitlines()[1:]
    rows = [line.rsplit("\t", 1) for line in lines if "\t" in line]
    ids = torch.full((len(rows), args.seq_len), tok.pad_id, dtype=torch.long)
    for i, (sentence, _) in enumerate(rows):
        piece = tok.encode(sentence).input_ids  # [CLS] ... [SEP]
        piece = piece[:args.seq_len - 1] + piece[-1:] if len(piece) > args.seq_len else piece
        ids[i, :len(piece)] = torch.tensor(piece)
    labels = torch.tensor([int(label) for _, label in rows])

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return len(rows)

        def __getitem__(self, i):
            return {"input_ids": ids[i], "attention_mask": (ids[i] != tok.pad_id).long(), "labels": labels[i]}

    model = BertForSequenceClassification(bert_config(args.preset, tok.vocab_size, args.seq_len))
    timer = Timer(args.warmup)
    with tempfile.TemporaryDirectory() as out:
        Trainer(model=model, args=training_args(out, args, args.steps), train_dataset=Rows(),
                callbacks=[timer.callback()]).train()
    examples = (args.steps - args.warmup) * args.batch_size
    return {"peer": "transformers Trainer (run_glue.py recipe)", "examples_per_s": examples / timer.seconds(args.steps)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("task", choices=["mlm", "glue", "t5"])
    parser.add_argument("--model", default="bert", choices=["bert", "modernbert"], help="mlm: the masked LM")
    parser.add_argument("--data", help="mlm: a bertkit prepared data directory (its train split's text)")
    parser.add_argument("--train", help="glue: the SST-2 train.tsv")
    parser.add_argument("--vocab", help="glue: the WordPiece vocabulary")
    parser.add_argument("--preset", default="base")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args(argv)
    print(json.dumps({"mlm": mlm, "glue": glue, "t5": t5}[args.task](args)), flush=True)


if __name__ == "__main__":
    main()
