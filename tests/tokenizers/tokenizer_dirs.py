"""Tokenizer directories of every kind for the tests: trained by bertkit, and written by transformers'
`save_pretrained` from tiny vocabularies built in-process (nothing is downloaded)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from bertkit.tokenizers import ByteLevelBPETokenizer, UnigramTokenizer, WordPieceTokenizer, truncate_longest_first
from bertkit.tokenizers.bpe import truncate_pair

from conftest import TINY_TEXT

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# More varied text than TINY_TEXT alone, so the vocabularies have real pieces and some unknown characters remain.
TEXTS = TINY_TEXT + [
    "Ünïcödé text: ÀÉÎÕÜ àéîõü ß æ œ ø, and the Greek ΑΒΓ αβγ.",
    "Tabs\tand\nnewlines, double  spaces, and trailing spaces   ",
    "Numbers 12345 67890 and symbols @#$%^&*()[]{}<>",
    "she sells sea shells; he sells sea shells too.",
]
UNIGRAM_EXTRA_IDS = 8
NAMES = ("wordpiece-bertkit", "bpe-bertkit", "unigram-bertkit", "wordpiece-transformers", "bpe-transformers",
         "unigram-transformers")


def albert_like_unigram() -> Tokenizer:
    """A Unigram tokenizer framed like ALBERT (`[CLS] A [SEP] B [SEP]`, types 0/1), lower-cased, trained here."""
    engine = Tokenizer(models.Unigram())
    engine.normalizer = normalizers.Sequence([normalizers.Replace("``", '"'), normalizers.NFKD(),
                                              normalizers.StripAccents(), normalizers.Lowercase(),
                                              normalizers.Replace(Regex(" {2,}"), " ")])
    engine.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")])
    engine.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    specials = ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]
    engine.train_from_iterator(TEXTS, trainers.UnigramTrainer(vocab_size=150, special_tokens=specials,
                                                              unk_token="<unk>", show_progress=False))
    engine.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", engine.token_to_id("[CLS]")), ("[SEP]", engine.token_to_id("[SEP]"))])
    return engine


def write_all(root: Path) -> dict[str, Path]:
    """Every directory of NAMES under `root`."""
    import transformers

    dirs = {name: root / name for name in NAMES}
    wordpiece = WordPieceTokenizer.train(TEXTS, vocab_size=220, min_frequency=1, show_progress=False)
    wordpiece.save(dirs["wordpiece-bertkit"])
    bpe = ByteLevelBPETokenizer.train(TEXTS, vocab_size=420, min_frequency=1, show_progress=False)
    bpe.save(dirs["bpe-bertkit"])
    UnigramTokenizer.train(TEXTS, vocab_size=200, extra_ids=UNIGRAM_EXTRA_IDS, show_progress=False) \
        .save(dirs["unigram-bertkit"])

    # transformers' own classes, built from nothing but the bare vocabulary files, then saved by transformers.
    bare = root / "bare-wordpiece"
    bare.mkdir()
    shutil.copy(dirs["wordpiece-bertkit"] / "vocab.txt", bare / "vocab.txt")
    transformers.BertTokenizerFast.from_pretrained(str(bare)).save_pretrained(str(dirs["wordpiece-transformers"]))
    bare = root / "bare-bpe"
    bare.mkdir()
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(dirs["bpe-bertkit"] / name, bare / name)
    transformers.RobertaTokenizerFast.from_pretrained(str(bare)).save_pretrained(str(dirs["bpe-transformers"]))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=albert_like_unigram(), unk_token="<unk>",
                                                pad_token="<pad>", cls_token="[CLS]", sep_token="[SEP]",
                                                mask_token="[MASK]")
    fast.save_pretrained(str(dirs["unigram-transformers"]))
    return dirs


def google_cut(tok, text: str, pair: str, max_length: int) -> tuple[list[int], list[int]] | None:
    """The pieces BERT's longest-first pair rule keeps of both texts, where it differs from transformers' rule.

    Google's rule (WordPieceTokenizer keeps it: on a tie the second text loses a piece first) and transformers'
    (the engine's: the odd piece goes to the longer text) keep different counts for some lengths; there a
    WordPiece pair is checked against Google's rule instead of transformers. None where both agree.
    """
    a, b = (e.ids for e in tok.encode_raw([text, pair]))
    budget = max_length - tok.num_special_tokens(pair=True)
    _, _, keep_a, keep_b = truncate_longest_first(a, b, budget)
    if (keep_a, keep_b) == truncate_pair(len(a), len(b), budget):
        return None
    return a[:keep_a], b[:keep_b]
