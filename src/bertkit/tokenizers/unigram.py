"""Unigram (SentencePiece-style) tokenisation, T5's vocabulary scheme, on the `tokenizers` engine.

Training runs the engine's UnigramTrainer on text prepared the way T5's tokenizer.json prepares it:

    NFKC (SentencePiece's nmt_nfkc, less its table) -> every run of whitespace -> one space -> strip
    -> Metaspace: each space becomes "▁" and starts a new word, and "▁" is put before the text (prepend "always")
    -> Unigram: the most likely split into pieces under the learned piece log-probabilities

The vocabulary is T5's: `<pad>`=0, `</s>`=1, `<unk>`=2, the learned pieces, and `extra_ids` sentinel tokens at
the end counted down (`<extra_id_0>` is the last id, `<extra_id_1>` the one before, as T5 numbers them). The
framing is T5's, `A </s>` and `A </s> B </s>`, one token type, no leading token (so `cls_id` is None) and no mask
token (`mask_id` is None: T5 corrupts spans with the sentinels).

It is saved as a transformers `tokenizer.json` + `tokenizer_config.json` (+ `special_tokens_map.json`) that
`transformers.AutoTokenizer` reads with the same ids. Reading back, and reading any other Unigram tokenizer.json
(ALBERT's, T5's, XLNet's, with their own post-processors), is `JsonTokenizer`'s: the file decides everything.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from bertkit.tokenizers.base import train_engine
from bertkit.tokenizers.tokenizer_json import TOKENIZER_FILE, JsonTokenizer

SPECIAL_TOKENS = ("<pad>", "</s>", "<unk>")  # ids 0, 1, 2, as in T5
# XLNet's special tokens, ids 0 .. 8 as in its released vocabulary; framing `A <sep> <cls>`, `A <sep> B <sep> <cls>`
XLNET_SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>", "<eod>", "<eop>")
DEFAULT_EXTRA_IDS = 100
SPACE = "▁"  # U+2581, SentencePiece's visible space
_SENTINEL = re.compile(r"<extra_id_(\d+)>")


def sentinel_token(n: int) -> str:
    """The n-th sentinel's string, `<extra_id_n>`."""
    return f"<extra_id_{n}>"


def t5_normalizer() -> normalizers.Normalizer:
    """NFKC, then any run of whitespace (tabs, newlines, exotic spaces) as one space, stripped at both ends."""
    return normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip()])


class UnigramTokenizer(JsonTokenizer):
    """A Unigram tokenizer: trained here with T5's scheme (`train`), or read from any Unigram tokenizer.json.

    `sentinel_ids[n]` is the id of `<extra_id_n>` (empty when the vocabulary has none).
    """

    kind = "unigram"  # as `load_tokenizer` and shard manifests name it

    def __init__(self, backend: Tokenizer, config: dict | None = None, source: str = TOKENIZER_FILE):
        model = json.loads(backend.to_str()).get("model") or {}
        if model.get("type", "Unigram") != "Unigram":
            raise ValueError(f"{source}: a unigram tokenizer needs a Unigram model, this one is {model.get('type')}")
        super().__init__(backend, config, source)
        numbered = {int(m.group(1)): i for t, i in self._vocab.items() if (m := _SENTINEL.fullmatch(t))}
        # Only an unbroken run <extra_id_0> .. <extra_id_{n-1}> counts as sentinels.
        count = 0
        while count in numbered:
            count += 1
        self.sentinel_ids = [numbered[n] for n in range(count)]

    @property
    def extra_ids(self) -> int:
        """How many sentinel tokens (`<extra_id_N>`) the vocabulary has."""
        return len(self.sentinel_ids)

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 32100, *, extra_ids: int = DEFAULT_EXTRA_IDS,
              max_piece_length: int = 16, shrinking_factor: float = 0.75,
              show_progress: bool = True, xlnet: bool = False) -> "UnigramTokenizer":
        """Learn a Unigram vocabulary of at most `vocab_size` ids from an iterable of strings, T5's way.

        vocab_size: the whole vocabulary, the 3 special tokens and the `extra_ids` sentinels included (T5's 32,100
            = 32,000 pieces + 100 sentinels); a small corpus may give fewer pieces.
        extra_ids: how many sentinels `<extra_id_0>` .. `<extra_id_{n-1}>` to put at the end (0 for none).
        texts: any iterable of strings (read lazily, once); to train from corpus files pass
            `bertkit.data.corpus.iter_lines(paths)`. Blank strings are skipped; ValueError when nothing is left.
        xlnet: XLNet's layout instead (`XLNET_SPECIAL_TOKENS` at ids 0 .. 8, framing `A <sep> <cls>` and
            `A <sep> B <sep> <cls>` with segment ids 0, 1 and 2 for <cls>, padding on the left); no sentinels.
        """
        if xlnet:
            extra_ids = 0
        specials = XLNET_SPECIAL_TOKENS if xlnet else SPECIAL_TOKENS
        if extra_ids < 0:
            raise ValueError(f"extra_ids must be >= 0, got {extra_ids}")
        pieces = vocab_size - extra_ids
        if pieces < len(specials) + 2:
            raise ValueError(f"vocab_size {vocab_size} is too small: the special tokens and {extra_ids} extra ids "
                             f"leave {max(pieces - len(specials), 0)} pieces")
        engine = Tokenizer(models.Unigram())
        engine.normalizer = t5_normalizer()
        engine.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always")
        trainer = trainers.UnigramTrainer(vocab_size=pieces, special_tokens=list(specials), unk_token="<unk>",
                                          max_piece_length=max_piece_length, shrinking_factor=shrinking_factor,
                                          show_progress=show_progress)
        try:
            train_engine(engine, trainer, texts)
        except Exception as err:
            if type(err) is not Exception:  # the texts' own errors (a corpus file's line, a wrong type) as they are
                raise
            raise ValueError(f"vocab_size {vocab_size} is too small for this text: {pieces} pieces (after "
                             f"{extra_ids} extra ids) cannot hold its characters ({err})") from None
        learned = [(piece, float(score)) for piece, score in json.loads(engine.to_str())["model"]["vocab"]]
        if [p for p, _ in learned[:len(specials)]] != list(specials):
            raise RuntimeError(f"the trainer did not put {specials} first")  # an engine change, not input
        learned[len(specials):] = canonical_order(learned[len(specials):])
        if xlnet:
            backend = build_xlnet_backend(learned)
            return cls(Tokenizer.from_str(backend.to_str()), xlnet_config(), source="trained vocabulary")
        sentinels = [sentinel_token(n) for n in reversed(range(extra_ids))]  # <extra_id_0> last
        backend = build_t5_backend(learned + [(s, 0.0) for s in sentinels])
        # The engine reads scores back from JSON a last digit off; going through the file's text once makes this
        # tokenizer the one every reader of the saved file (transformers included) gets, bit for bit.
        return cls(Tokenizer.from_str(backend.to_str()), t5_config(extra_ids), source="trained vocabulary")

    def __repr__(self) -> str:
        return f"UnigramTokenizer(vocab_size={self.vocab_size}, extra_ids={self.extra_ids})"


def canonical_order(pieces: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """The `tokenizers` Unigram trainer's pieces [(piece, log-probability)] in an order that is the same on every
    run for the same text; the trainer's own changes from process to process in three ways, each undone here:

    - the characters it must keep but had pruned come back with the scores min, min + 1e-4, min + 2e-4, ... (min:
      the lowest score it learned) handed out in its hash set's order: here in code point order;
    - its sums run in hash-map order, so scores differ in their last bits: they are rounded to 8 decimals (a change
      of at most 5e-9 in a log probability; a score within ~1e-14 of a rounding boundary, about one in 10^6, may
      still round either way);
    - equal scores come in hash-map order: here in code point order.
    """
    if not pieces:
        return []
    lowest = min(score for _, score in pieces)
    rungs: dict[int, list[int]] = {}  # k -> the single characters scored min + k * 1e-4
    for i, (piece, score) in enumerate(pieces):
        k = round((score - lowest) / 1e-4)
        if len(piece) == 1 and abs(score - (lowest + k * 1e-4)) < 1e-9:
            rungs.setdefault(k, []).append(i)
    ladder: list[int] = []
    while len(rungs.get(len(ladder), ())) == 1:
        ladder.append(rungs[len(ladder)][0])
    pieces = list(pieces)
    for i, char in zip(ladder, sorted(pieces[i][0] for i in ladder)):  # the rungs' scores, characters re-dealt
        pieces[i] = (char, pieces[i][1])
    return sorted(((piece, round(score, 8)) for piece, score in pieces), key=lambda item: (-item[1], item[0]))


def build_t5_backend(vocab: list[tuple[str, float]]) -> Tokenizer:
    """T5's tokenizer.json pipeline around a Unigram vocabulary [(piece, log-probability)] that starts with
    `<pad> </s> <unk>`: normaliser, Metaspace, framing `A </s>` / `A </s> B </s>`, and every special token
    (sentinels included) matched whole in text and skipped by decoding."""
    engine = Tokenizer(models.Unigram(vocab, unk_id=SPECIAL_TOKENS.index("<unk>"), byte_fallback=False))
    engine.normalizer = t5_normalizer()
    engine.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always")
    engine.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="always")
    specials = [*SPECIAL_TOKENS, *(p for p, _ in vocab if _SENTINEL.fullmatch(p))]
    engine.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    eos = SPECIAL_TOKENS.index("</s>")
    engine.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                          special_tokens=[("</s>", eos)])
    return engine


def build_xlnet_backend(vocab: list[tuple[str, float]]) -> Tokenizer:
    """XLNet's tokenizer.json pipeline around a Unigram vocabulary that starts with `XLNET_SPECIAL_TOKENS`: the
    normaliser and Metaspace of `build_t5_backend`, and XLNet's framing: `A <sep> <cls>` (segments 0 0 2) and
    `A <sep> B <sep> <cls>` (0 0 1 1 2)."""
    engine = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=False))
    engine.normalizer = t5_normalizer()
    engine.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always")
    engine.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="always")
    engine.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in XLNET_SPECIAL_TOKENS])
    sep, cls = XLNET_SPECIAL_TOKENS.index("<sep>"), XLNET_SPECIAL_TOKENS.index("<cls>")
    engine.post_processor = processors.TemplateProcessing(
        single="$A:0 <sep>:0 <cls>:2", pair="$A:0 <sep>:0 $B:1 <sep>:1 <cls>:2",
        special_tokens=[("<sep>", sep), ("<cls>", cls)])
    return engine


def xlnet_config() -> dict:
    """tokenizer_config.json for an XLNet-style tokenizer.json: XLNet's special tokens by role, padding on the left,
    segment ids among the model inputs (`PreTrainedTokenizerFast`, which runs the file as it stands, as `t5_config`
    says)."""
    return {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "bos_token": "<s>",
            "eos_token": "</s>", "cls_token": "<cls>", "sep_token": "<sep>", "pad_token": "<pad>",
            "mask_token": "<mask>", "additional_special_tokens": ["<eod>", "<eop>"], "padding_side": "left",
            "model_input_names": ["input_ids", "token_type_ids", "attention_mask"],  # XLNet reads segment ids
            "model_max_length": 512, "clean_up_tokenization_spaces": False}


def t5_config(extra_ids: int) -> dict:
    """tokenizer_config.json for a T5-style tokenizer.json.

    The class is `PreTrainedTokenizerFast`, which runs the file as it stands: transformers' `T5Tokenizer` would
    rebuild the pipeline from the vocabulary alone and drop this normaliser.
    """
    return {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>", "unk_token": "<unk>",
            "pad_token": "<pad>", "additional_special_tokens": [sentinel_token(n) for n in range(extra_ids)],
            "model_max_length": 512, "clean_up_tokenization_spaces": False}
