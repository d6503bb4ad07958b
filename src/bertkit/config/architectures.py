"""The config classes of the architectures beside the BERT family: ModernBERT, T5, XLNet and ELMo, each its own
frozen dataclass with transformers' config.json keys and its size presets (see `bertkit.config`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from bertkit.config.base import (ACTIVATIONS, IGNORED_CONFIG_KEYS, ConfigFile, check_choice, check_fields,
                                 check_finite, check_token_ids)
from bertkit.config.base import field_with_help as _f

# ==================================================================================================================
# ModernBERT
# ==================================================================================================================
# ModernBERT is its own architecture (rotary positions, GeGLU, pre-norm, alternating local/global attention), so
# it has its own config rather than BertConfig fields. Field names are transformers' ModernBertConfig keys.
MODERNBERT_POOLING = ("cls", "mean")
# config.json keys of transformers' ModernBertConfig that change nothing bertkit computes: kernel choices,
# transformers' sparse-prediction switch (bertkit's is `predict_at`), and leftovers found in released configs.
_MODERNBERT_IGNORED_KEYS = (IGNORED_CONFIG_KEYS - {"classifier_dropout", "bos_token_id", "eos_token_id",
                                             "sep_token_id", "tie_word_embeddings"}) | {
    "deterministic_flash_attn", "sparse_prediction", "sparse_pred_ignore_index", "reference_compile",
    "repad_logits_with_grad", "layer_norm_eps", "position_embedding_type", "num_labels"}
_ROPE_KINDS = {"full_attention": "global_rope_theta", "sliding_attention": "local_rope_theta"}


# name -> (layers L, hidden H, heads A, intermediate I). base and large are the released ModernBERT shapes (deep and
# narrow: 64-wide heads, a GeGLU of 1.5H for base); the small ones keep base's proportions for CPU runs.
MODERNBERT_PRESETS: dict[str, tuple[int, int, int, int]] = {
    "tiny": (2, 128, 2, 192),
    "mini": (4, 256, 4, 384),
    "small": (8, 384, 6, 576),
    "base": (22, 768, 12, 1152),
    "large": (28, 1024, 16, 2624),
}


@dataclass(frozen=True)
class ModernBertConfig(ConfigFile):
    """Hyper-parameters of a ModernBERT encoder; names and defaults are those of ModernBERT-base in transformers.

    Layer i attends globally when i % global_attn_every_n_layers == 0 and otherwise within a sliding window of
    `local_attention` tokens (a token sees the tokens at distance <= local_attention // 2 on either side).
    """

    model_type: ClassVar[str] = "modernbert"  # the on-disk family (transformers' model_type)
    LABEL: ClassVar[str] = "ModernBERT"
    EXTRA_KEYS: ClassVar[frozenset[str]] = frozenset({"layer_types", "rope_parameters"})
    REQUIRED: ClassVar[dict[str, tuple[Any, str]]] = {
        "tie_word_embeddings": (True, "the MLM decoder is the token-embedding matrix: only true"),
        "rope_scaling": (None, "plain rotary embeddings only")}
    IGNORED_KEYS: ClassVar[frozenset[str]] = _MODERNBERT_IGNORED_KEYS
    PRESETS: ClassVar[dict[str, tuple]] = MODERNBERT_PRESETS  # the size presets `preset` builds

    vocab_size: int = _f(50368, 'rows of the token-embedding matrix (and of the MLM decoder)')
    hidden_size: int = _f(768, 'H: width of every hidden state')
    intermediate_size: int = _f(1152, 'I: width of the GeGLU feed-forward block (Wi produces 2I: input and gate)')
    num_hidden_layers: int = _f(22, 'L: number of encoder layers')
    num_attention_heads: int = _f(12, 'A: heads per self-attention; must divide H, and H / A must be even (rotary)')
    hidden_activation: str = _f("gelu", 'the GeGLU activation, applied to the input half; "gelu" is the exact GELU')
    max_position_embeddings: int = _f(8192, 'the longest input accepted (rotary positions have no table)')
    initializer_range: float = _f(0.02, 'standard deviation of the (truncated) normal initialisation')
    initializer_cutoff_factor: float = _f(2.0, 'initial weights are cut at +- this many standard deviations')
    norm_eps: float = _f(1e-5, 'LayerNorm epsilon')
    norm_bias: bool = _f(False, 'LayerNorms have a bias')
    pad_token_id: int = _f(50283, 'id of the padding token (its embedding gets no gradient)')
    eos_token_id: int | None = _f(50282, 'end-of-sequence id, written to config.json')
    bos_token_id: int | None = _f(50281, 'beginning-of-sequence id, written to config.json')
    cls_token_id: int | None = _f(50281, '[CLS] id, written to config.json')
    sep_token_id: int | None = _f(50282, '[SEP] id, written to config.json')
    global_rope_theta: float = _f(160000.0, 'rotary base of the global-attention layers')
    local_rope_theta: float = _f(10000.0, 'rotary base of the sliding-window layers')
    attention_bias: bool = _f(False, 'the query/key/value and attention output projections have biases')
    attention_dropout: float = _f(0.0, 'dropout on attention probabilities and on the attention output')
    global_attn_every_n_layers: int = _f(3, 'layers 0, n, 2n, ... attend globally, the others locally')
    local_attention: int = _f(128, 'sliding-window width: a token sees local_attention // 2 tokens either side')
    embedding_dropout: float = _f(0.0, 'dropout after the embedding LayerNorm')
    mlp_bias: bool = _f(False, 'the feed-forward projections have biases')
    mlp_dropout: float = _f(0.0, 'dropout between the GeGLU and its output projection')
    decoder_bias: bool = _f(True, 'the MLM decoder (tied to the token embeddings) has a bias')
    classifier_pooling: str = _f("cls", 'sequence classification reads the first token ("cls") or the mean of the '
                                        'real tokens ("mean")')
    classifier_dropout: float = _f(0.0, 'dropout before the classifier')
    classifier_bias: bool = _f(False, 'the prediction head\'s dense layer (MLM and classifiers) has a bias')
    classifier_activation: str = _f("gelu", 'activation of the prediction head (MLM and classifiers)')

    def __post_init__(self) -> None:
        check_fields(self, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                            "num_attention_heads", "max_position_embeddings", "global_attn_every_n_layers",
                            "local_attention"), "positive integer")
        check_finite(self, ("initializer_range", "initializer_cutoff_factor", "norm_eps", "global_rope_theta",
                            "local_rope_theta", "attention_dropout", "embedding_dropout", "mlp_dropout",
                            "classifier_dropout"))  # NaN and infinities pass the range checks below
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"ModernBertConfig: num_attention_heads ({self.num_attention_heads}) must divide "
                             f"hidden_size ({self.hidden_size})")
        if self.head_dim % 2:
            raise ValueError(f"ModernBertConfig: the head size hidden_size / num_attention_heads = {self.head_dim} "
                             f"must be even (rotary embeddings turn pairs of dimensions)")
        check_fields(self, ("attention_dropout", "embedding_dropout", "mlp_dropout", "classifier_dropout"),
                     "probability")
        check_choice(self, "hidden_activation", ACTIVATIONS)
        check_choice(self, "classifier_activation", ACTIVATIONS)
        check_choice(self, "classifier_pooling", MODERNBERT_POOLING)
        check_token_ids(self, ("pad_token_id",))
        check_fields(self, ("initializer_range", "initializer_cutoff_factor", "norm_eps", "global_rope_theta",
                            "local_rope_theta"), "positive number")
        check_fields(self, ("norm_bias", "attention_bias", "mlp_bias", "decoder_bias", "classifier_bias"), "boolean")

    # ---- derived facts -------------------------------------------------------------------------------------

    @property
    def sliding_window(self) -> int:
        """How far a local layer's token sees on either side: local_attention // 2 (transformers' rule)."""
        return self.local_attention // 2

    def is_global(self, layer: int) -> bool:
        """Whether layer `layer` (from 0) attends over the whole sequence rather than a sliding window."""
        return layer % self.global_attn_every_n_layers == 0

    @property
    def layer_types(self) -> list[str]:
        """transformers' per-layer spelling of the attention pattern."""
        return ["full_attention" if self.is_global(i) else "sliding_attention" for i in range(self.num_hidden_layers)]

    # ---- JSON io -------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The config as transformers' ModernBertConfig takes it: every field under its own name, the attention
        pattern and rotary bases both as the released configs spell them (global_attn_every_n_layers,
        global_rope_theta, local_rope_theta) and as current transformers does (layer_types, rope_parameters)."""
        data = self.field_dict()
        data.update(model_type=self.model_type, layer_types=self.layer_types, tie_word_embeddings=True,
                    rope_parameters={kind: {"rope_type": "default", "rope_theta": getattr(self, name)}
                                     for kind, name in _ROPE_KINDS.items()})
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "ModernBertConfig":
        """Build from a transformers ModernBERT config dict (current or released spelling); `source` names the
        file in errors. Unknown keys, and values bertkit does not build (untied decoder, scaled rotary, an
        irregular layer pattern, ...), are refused naming the key."""
        fields = cls.read_fields(data, source)
        for kind, params in (data.get("rope_parameters") or {}).items():
            if kind not in _ROPE_KINDS or not isinstance(params, dict):
                raise ValueError(f"{source}: rope_parameters has an unknown entry {kind!r}")
            extra = sorted(set(params) - {"rope_type", "rope_theta"})
            if params.get("rope_type", "default") != "default" or extra:
                what = f"rope_type={params.get('rope_type')!r}" if not extra else f"keys {extra}"
                raise ValueError(f"{source}: rope_parameters.{kind} {what} is not supported by bertkit (plain "
                                 f"rotary embeddings only)")
            if "rope_theta" in params:  # current transformers lets rope_parameters win over the released keys
                fields[_ROPE_KINDS[kind]] = params["rope_theta"]
        if data.get("layer_types") is not None:
            fields["global_attn_every_n_layers"] = _every_n(data["layer_types"], fields.get(
                "global_attn_every_n_layers"), fields.get("num_hidden_layers", 22), source)
        return cls.build(fields, source)


def _every_n(layer_types: Any, stated: Any, num_layers: Any, source: str) -> Any:
    """transformers' `layer_types` list -> global_attn_every_n_layers (the stated value when it agrees); a pattern
    that is not "global every n layers from layer 0" is refused."""
    if not isinstance(layer_types, list) or not all(t in _ROPE_KINDS for t in layer_types):
        raise ValueError(f"{source}: layer_types must be a list of {sorted(_ROPE_KINDS)}, got {layer_types!r}")
    if len(layer_types) != num_layers:
        raise ValueError(f"{source}: layer_types has {len(layer_types)} entries for num_hidden_layers={num_layers}")
    candidates = [stated] if isinstance(stated, int) and stated > 0 else []
    candidates += list(range(1, len(layer_types) + 1))
    for n in candidates:
        if all((t == "full_attention") == (i % n == 0) for i, t in enumerate(layer_types)):
            return n
    raise ValueError(f"{source}: layer_types {layer_types} is not supported by bertkit (global attention every "
                     f"n layers from layer 0 only)")


# ==================================================================================================================
# T5
# ==================================================================================================================
# T5 is an encoder-decoder with relative position biases and RMS norms, so it has its own config. Field names are
# transformers' T5Config keys, and config.json is read and written under them.
# feed_forward_proj -> the activation transformers derives from it (its `dense_act_fn`): T5 1.0's ReLU block and
# T5 1.1's gated block with the tanh GELU.
T5_FEED_FORWARD = {"relu": "relu", "gated-gelu": "gelu_new"}
# config.json keys of transformers' T5Config that change nothing bertkit computes: transformers' own machinery,
# T5ForSequenceClassification's dropout, and `n_positions`, which released configs carry although relative
# positions need no table.
_T5_IGNORED_KEYS = (IGNORED_CONFIG_KEYS - {"eos_token_id", "tie_word_embeddings", "decoder_start_token_id",
                                     "is_encoder_decoder", "is_decoder"}) | {"n_positions", "num_labels"}


# name -> (layers per stack, d_model, heads, d_ff), heads of d_kv 64. small, base and large are the T5 paper's sizes
# (t5-small, t5-base, t5-large); tiny and mini keep their proportions for CPU runs.
T5_PRESETS: dict[str, tuple[int, int, int, int]] = {
    "tiny": (2, 128, 2, 512),
    "mini": (4, 256, 4, 1024),
    "small": (6, 512, 8, 2048),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}


@dataclass(frozen=True)
class T5Config(ConfigFile):
    """Hyper-parameters of a T5 encoder-decoder; names and defaults are those of transformers' T5Config (t5-small).

    T5 1.0 is feed_forward_proj "relu" with the output projection tied to the shared embeddings (and the decoder
    output scaled by d_model**-0.5 before it); T5 1.1 is "gated-gelu" with an lm_head of its own, unscaled.
    """

    model_type: ClassVar[str] = "t5"  # the on-disk family (transformers' model_type)
    LABEL: ClassVar[str] = "T5"
    EXTRA_KEYS: ClassVar[frozenset[str]] = frozenset({"dense_act_fn", "is_gated_act"})
    REQUIRED: ClassVar[dict[str, tuple[Any, str]]] = {
        "is_decoder": (False, "a T5 directory holds an encoder or an encoder-decoder: only false")}
    IGNORED_KEYS: ClassVar[frozenset[str]] = _T5_IGNORED_KEYS
    PRESETS: ClassVar[dict[str, tuple]] = T5_PRESETS  # the size presets `preset` builds
    PRESET_FIELDS: ClassVar[tuple[str, ...]] = ("num_layers", "d_model", "num_heads", "d_ff")

    vocab_size: int = _f(32128, 'rows of the shared embedding matrix (and of the output projection)')
    d_model: int = _f(512, 'width of every hidden state')
    d_kv: int = _f(64, 'width of one attention head\'s queries, keys and values (num_heads * d_kv need not be '
                       'd_model)')
    d_ff: int = _f(2048, 'width of the feed-forward block')
    num_layers: int = _f(6, 'encoder layers')
    num_decoder_layers: int | None = _f(None, 'decoder layers; None = num_layers')
    num_heads: int = _f(8, 'attention heads')
    relative_attention_num_buckets: int = _f(32, 'relative-position buckets (half per direction in the encoder)')
    relative_attention_max_distance: int = _f(128, 'distances from here on share the last bucket')
    dropout_rate: float = _f(0.1, 'dropout on embeddings, attention probabilities, residual branches, inside the '
                                  'feed-forward block and after the final norm')
    layer_norm_epsilon: float = _f(1e-6, 'epsilon of the RMS norms')
    initializer_factor: float = _f(1.0, 'scales every initial standard deviation (1.0 = T5\'s initialisation)')
    feed_forward_proj: str = _f("relu", 'feed-forward kind: "relu" (T5 1.0) or "gated-gelu" (T5 1.1, tanh GELU)')
    tie_word_embeddings: bool = _f(True, 'the output projection is the shared embedding matrix (T5 1.0); false: '
                                         'an lm_head of its own (T5 1.1)')
    scale_decoder_outputs: bool | None = _f(None, 'multiply the decoder output by d_model**-0.5 before the output '
                                                  'projection; None = T5\'s rule: exactly when tied')
    is_encoder_decoder: bool = _f(True, 'the directory holds a decoder (false: an encoder alone, T5EncoderModel)')
    pad_token_id: int = _f(0, 'id of the padding token')
    eos_token_id: int = _f(1, 'id of the end-of-sequence token </s>')
    decoder_start_token_id: int = _f(0, 'the decoder\'s first input token (T5: the padding id)')

    def __post_init__(self) -> None:
        check_finite(self, ("dropout_rate", "layer_norm_epsilon", "initializer_factor"))  # NaN passes range checks
        check_fields(self, ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads",
                            "relative_attention_num_buckets", "relative_attention_max_distance"), "positive integer")
        check_fields(self, ("num_decoder_layers",), "positive integer or None")
        check_choice(self, "feed_forward_proj", tuple(T5_FEED_FORWARD))
        # Each direction's buckets: half exact distances, half logarithmic up to max_distance; fewer than 4 buckets
        # or a max_distance inside the exact range leave the logarithmic half undefined (a division by log 1 = 0).
        if self.relative_attention_num_buckets < 4:
            raise ValueError(f"T5Config.relative_attention_num_buckets must be at least 4, got "
                             f"{self.relative_attention_num_buckets}")
        if self.relative_attention_max_distance <= self.relative_attention_num_buckets // 2:
            raise ValueError(f"T5Config.relative_attention_max_distance ({self.relative_attention_max_distance}) "
                             f"must exceed relative_attention_num_buckets // 2 "
                             f"({self.relative_attention_num_buckets // 2})")
        check_fields(self, ("dropout_rate",), "probability")
        check_fields(self, ("layer_norm_epsilon", "initializer_factor"), "positive number")
        check_fields(self, ("tie_word_embeddings", "is_encoder_decoder"), "boolean")
        check_fields(self, ("scale_decoder_outputs",), "boolean or None")
        check_token_ids(self, ("pad_token_id", "eos_token_id", "decoder_start_token_id"))

    # ---- derived facts -------------------------------------------------------------------------------------

    @property
    def decoder_layers(self) -> int:
        return self.num_layers if self.num_decoder_layers is None else self.num_decoder_layers

    @property
    def inner_dim(self) -> int:
        """Width of the concatenated attention heads: num_heads * d_kv."""
        return self.num_heads * self.d_kv

    @property
    def gated(self) -> bool:
        """Whether the feed-forward block is gated (two input projections, T5 1.1)."""
        return self.feed_forward_proj.startswith("gated-")

    @property
    def activation(self) -> str:
        """The feed-forward activation by its transformers name (relu, or gelu_new: the tanh GELU)."""
        return T5_FEED_FORWARD[self.feed_forward_proj]

    @property
    def scale_output(self) -> bool:
        """Whether the decoder output is scaled by d_model**-0.5 before the output projection."""
        return self.tie_word_embeddings if self.scale_decoder_outputs is None else self.scale_decoder_outputs

    # ---- JSON io -------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The config as transformers' T5Config takes it (and writes it: dense_act_fn and is_gated_act too).

        scale_decoder_outputs is written only where it departs from T5's rule (scaled exactly when tied), the one
        case older transformers versions cannot express.
        """
        data = self.field_dict()
        del data["scale_decoder_outputs"]
        data.update(num_decoder_layers=self.decoder_layers, model_type=self.model_type, is_decoder=False,
                    dense_act_fn=self.activation, is_gated_act=self.gated)
        if self.scale_output != self.tie_word_embeddings:
            data["scale_decoder_outputs"] = self.scale_output
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "T5Config":
        """Build from a transformers T5 config dict; `source` names the file in errors. Unknown keys, and values
        bertkit does not build (a decoder config, another feed-forward kind, several EOS ids), are refused naming
        the key."""
        fields = cls.read_fields(data, source)
        eos = fields.get("eos_token_id")
        if isinstance(eos, list):  # transformers allows a list of EOS ids; generation here stops on one
            if len(eos) != 1:
                raise ValueError(f"{source}: eos_token_id={eos!r} is not supported by bertkit (one id only)")
            fields["eos_token_id"] = eos[0]
        if fields.get("num_decoder_layers") == fields.get("num_layers", 6):
            fields["num_decoder_layers"] = None  # as many as the encoder: the default, so configs compare equal
        if fields.get("decoder_start_token_id") is None:  # T5's convention when the key is absent
            fields["decoder_start_token_id"] = fields.get("pad_token_id", 0)
        proj = fields.get("feed_forward_proj", "relu")
        derived = {"dense_act_fn": T5_FEED_FORWARD.get(proj), "is_gated_act": proj.startswith("gated-")}
        for key, want in derived.items():  # transformers writes these two, derived from feed_forward_proj
            if key in data and proj in T5_FEED_FORWARD and data[key] != want:
                raise ValueError(f"{source}: {key}={data[key]!r} contradicts feed_forward_proj={proj!r} (which "
                                 f"means {key}={want!r})")
        return cls.build(fields, source)


# ==================================================================================================================
# XLNet
# ==================================================================================================================
# XLNet is a Transformer-XL encoder (relative positions and segments, memory) trained by permutation language
# modelling, so it has its own config. Field names are transformers' XLNetConfig keys.
XLNET_SUMMARY_TYPES = ("last", "first", "mean")  # the sequence summary: the last token (<cls>), the first, the mean
XLNET_SUMMARY_ACTIVATIONS = (None, "tanh", "linear")  # after the summary projection ("linear": none)
# config.json keys of transformers' XLNetConfig that change nothing bertkit computes: transformers' machinery and
# the SQuAD beam head's sizes (bertkit's span head has no beam).
_XLNET_IGNORED_KEYS = (IGNORED_CONFIG_KEYS - {"bos_token_id", "eos_token_id", "tie_word_embeddings"}) | {
    "start_n_top", "end_n_top", "num_labels", "n_token", "use_mems_eval", "use_mems_train", "layer_norm_epsilon"}


# name -> (layers L, d_model, heads, d_inner), heads of 64. base and large are the paper's XLNet-Base and -Large;
# tiny and mini keep their proportions for CPU runs (mini: the `mini` BERT's shape).
XLNET_PRESETS: dict[str, tuple[int, int, int, int]] = {
    "tiny": (2, 128, 2, 512),
    "mini": (4, 256, 4, 1024),
    "small": (4, 512, 8, 2048),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}


@dataclass(frozen=True)
class XLNetConfig(ConfigFile):
    """Hyper-parameters of an XLNet; names and defaults are those of transformers' XLNetConfig (xlnet-large).

    bertkit builds the bidirectional XLNet (attn_type "bi"); the Transformer-XL decoder ("uni") is refused.
    """

    model_type: ClassVar[str] = "xlnet"  # the on-disk family (transformers' model_type)
    LABEL: ClassVar[str] = "XLNet"
    REQUIRED: ClassVar[dict[str, tuple[Any, str]]] = {
        "tie_word_embeddings": (True, "the LM head is the token-embedding matrix: only true"),
        "summary_proj_to_labels": (False, "the summary projects to d_model: only false")}
    IGNORED_KEYS: ClassVar[frozenset[str]] = _XLNET_IGNORED_KEYS
    PRESETS: ClassVar[dict[str, tuple]] = XLNET_PRESETS  # the size presets `preset` builds
    PRESET_FIELDS: ClassVar[tuple[str, ...]] = ("n_layer", "d_model", "n_head", "d_inner")

    vocab_size: int = _f(32000, 'rows of the token-embedding matrix (and of the tied LM head)')
    d_model: int = _f(1024, 'H: width of every hidden state')
    n_layer: int = _f(24, 'L: number of layers')
    n_head: int = _f(16, 'N: attention heads; must divide d_model')
    d_inner: int = _f(4096, 'width of the feed-forward block')
    ff_activation: str = _f("gelu", 'feed-forward activation (transformers\' name; "gelu" is the exact GELU)')
    attn_type: str = _f("bi", 'attention kind: "bi" (XLNet) only')
    initializer_range: float = _f(0.02, 'standard deviation of the normal initialisation')
    layer_norm_eps: float = _f(1e-12, 'LayerNorm epsilon')
    dropout: float = _f(0.1, 'dropout on embeddings, positions, attention probabilities, residual branches, output')
    mem_len: int | None = _f(512, 'hidden states kept as memory for the next segment; None or 0 = all of them')
    reuse_len: int | None = _f(None, 'only the first reuse_len tokens of a segment go into the memory; None = all')
    bi_data: bool = _f(False, 'the second half of the batch reads relative positions backwards (pretraining)')
    clamp_len: int = _f(-1, 'relative distances beyond this are clamped; -1 = none')
    same_length: bool = _f(False, 'Transformer-XL\'s equal attention length (used by attn_type "uni" only)')
    summary_type: str = _f("last", 'the sequence summary reads the "last" token (<cls>), the "first", or the "mean"')
    summary_use_proj: bool = _f(True, 'a dense layer (d_model -> d_model) after the summary')
    summary_activation: str | None = _f("tanh", 'activation after that layer: "tanh", "linear" or None (none)')
    summary_last_dropout: float = _f(0.1, 'dropout after the summary')
    summary_first_dropout: float = _f(0.0, 'dropout before the summary projection')
    pad_token_id: int = _f(5, 'id of the padding token (<pad>)')
    bos_token_id: int | None = _f(1, 'beginning-of-sequence id <s>, written to config.json')
    eos_token_id: int | None = _f(2, 'end-of-sequence id </s>, written to config.json')
    d_head: int | None = _f(None, 'head size; None = d_model / n_head (the only value transformers accepts)')

    def __post_init__(self) -> None:
        check_fields(self, ("vocab_size", "d_model", "n_layer", "n_head", "d_inner"), "positive integer")
        check_finite(self, ("initializer_range", "layer_norm_eps", "dropout", "summary_last_dropout",
                            "summary_first_dropout"))
        if self.d_model % self.n_head:
            raise ValueError(f"XLNetConfig: n_head ({self.n_head}) must divide d_model ({self.d_model})")
        if self.d_head is not None and self.d_head != self.d_model // self.n_head:
            raise ValueError(f"XLNetConfig.d_head {self.d_head!r} must be d_model / n_head "
                             f"({self.d_model // self.n_head})")
        if self.attn_type != "bi":
            raise ValueError(f"XLNetConfig.attn_type {self.attn_type!r} is not supported by bertkit (\"bi\" only: "
                             f"XLNet's bidirectional attention; \"uni\" is the Transformer-XL decoder)")
        check_choice(self, "ff_activation", ACTIVATIONS)
        check_choice(self, "summary_type", XLNET_SUMMARY_TYPES)
        check_choice(self, "summary_activation", XLNET_SUMMARY_ACTIVATIONS)
        check_fields(self, ("mem_len", "reuse_len"), "non-negative integer or None")
        if self.reuse_len and self.mem_len and self.reuse_len > self.mem_len:
            raise ValueError(f"XLNetConfig: reuse_len ({self.reuse_len}) does not fit in mem_len ({self.mem_len})")
        check_fields(self, ("clamp_len",), "integer")
        check_fields(self, ("dropout", "summary_last_dropout", "summary_first_dropout"), "probability")
        check_fields(self, ("initializer_range", "layer_norm_eps"), "positive number")
        check_fields(self, ("bi_data", "same_length", "summary_use_proj"), "boolean")
        check_token_ids(self, ("pad_token_id",))

    # ---- derived facts (the names the other verbs read) ------------------------------------------------------

    @property
    def hidden_size(self) -> int:
        return self.d_model

    @property
    def num_hidden_layers(self) -> int:
        return self.n_layer

    @property
    def num_attention_heads(self) -> int:
        return self.n_head

    @property
    def max_length(self) -> int:
        """The longest input the verbs feed: XLNet's relative positions have no table, so no limit of the model's
        own; 512 (the paper's pretraining length) bounds what the verbs cut inputs to."""
        return 512

    # ---- construction --------------------------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "XLNetConfig":
        """A size preset of XLNET_PRESETS (tiny, mini, small, base, large) with fields over it; the BERT spellings
        a recipe may carry (hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
        max_position_embeddings) are mapped or dropped; `model_type="xlnet"` may be among them."""
        overrides.pop("max_position_embeddings", None)  # relative positions: no table to size
        for bert, ours in zip(ConfigFile.PRESET_FIELDS, cls.PRESET_FIELDS):
            if bert in overrides:
                overrides[ours] = overrides.pop(bert)
        return super().preset(name, **overrides)

    # ---- JSON io -------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The config as transformers' XLNetConfig takes it (d_head written out, the LM head tied)."""
        data = self.field_dict()
        data.update(model_type=self.model_type, d_head=self.head_dim, tie_word_embeddings=True)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "XLNetConfig":
        """Build from a transformers XLNet config dict; `source` names the file in errors. Unknown keys, and values
        bertkit does not build (attn_type "uni", an untied LM head, a summary projected to the labels, ...), are
        refused naming the key."""
        fields = cls.read_fields(data, source)
        if "vocab_size" not in fields and "n_token" in data:  # the name of old configs
            fields["vocab_size"] = data["n_token"]
        if fields.get("summary_activation") == "":
            fields["summary_activation"] = None
        if isinstance(fields.get("eos_token_id"), list):
            fields["eos_token_id"] = fields["eos_token_id"][0] if fields["eos_token_id"] else None
        return dataclasses.replace(cls.build(fields, source), d_head=None)


# ------------------------------------------------------------------------------------------------------------------
# ELMo (bertkit.models.elmo): a character-CNN token encoder under a bidirectional LSTM language model
# ------------------------------------------------------------------------------------------------------------------
# name -> (char-CNN filters ((width, count), ...), highway layers, projection P, LSTM cell size, biLSTM layers).
# "original" is the released ELMo (Peters et al. 2018; allenai/bilm-tf options.json): 2048 filters, 2 highway
# layers, 512-wide projections of 4096-cell LSTMs, 2 layers; tiny and mini keep its shape for CPU runs.
ELMO_PRESETS: dict[str, tuple] = {
    "tiny": (((1, 8), (2, 8), (3, 16)), 1, 32, 64, 2),
    "mini": (((1, 32), (2, 32), (3, 64), (4, 128), (5, 128)), 2, 128, 512, 2),
    "small": (((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 256)), 2, 256, 1024, 2),
    "original": (((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024)), 2, 512, 4096, 2),
}


@dataclass(frozen=True)
class ElmoConfig(ConfigFile):
    """Hyper-parameters of an ELMo biLM (bilm-tf's options.json, in bertkit's names)."""

    model_type: ClassVar[str] = "elmo"  # the on-disk family (bertkit's own: transformers has no ELMo)
    LABEL: ClassVar[str] = "ELMo"
    IGNORED_KEYS: ClassVar[frozenset[str]] = frozenset({"model_type", "architectures"})
    PRESETS: ClassVar[dict[str, tuple]] = ELMO_PRESETS  # the size presets `preset` builds
    PRESET_FIELDS: ClassVar[tuple[str, ...]] = ("filters", "num_highway", "projection_dim", "lstm_dim", "num_layers")

    vocab_size: int = _f(30000, 'words of the softmax (the word tokenizer\'s vocabulary)')
    char_vocab_size: int = _f(262, 'characters of the character embedding (the word tokenizer\'s, specials '
                                     'included)')
    max_characters: int = _f(50, 'characters per word, begin/end-of-word marks included; longer words are cut')
    char_embedding_dim: int = _f(16, 'width of one character\'s embedding')
    filters: tuple = _f(ELMO_PRESETS["original"][0], 'char-CNN filters as (width, count) pairs; their counts sum '
                                                      'to the CNN output width')
    num_highway: int = _f(2, 'highway layers after the convolutions')
    projection_dim: int = _f(512, 'P: the token vector and each LSTM output (one direction) after projection')
    lstm_dim: int = _f(4096, 'memory cells per LSTM (projected down to projection_dim when larger)')
    num_layers: int = _f(2, 'biLSTM layers (each a forward and a backward LSTM with weights of their own)')
    cell_clip: float | None = _f(None, 'clip LSTM cell values to [-x, x] (bilm-tf: 3; None: no clipping, which '
                                       'runs the fused nn.LSTM)')
    proj_clip: float | None = _f(None, 'clip projected LSTM outputs to [-x, x] (bilm-tf: 3; None: no clipping)')
    residual: bool = _f(True, 'add each biLSTM layer\'s input to its output from the second layer on')
    dropout: float = _f(0.1, 'dropout on every LSTM layer\'s input and on the softmax input')
    sampled_softmax: int = _f(0, 'train with a sampled softmax of this many log-uniform negative words per batch '
                                 '(0: the full softmax; evaluation is always full)')
    pad_token_id: int = _f(0, 'id of the padding word')

    def __post_init__(self) -> None:
        check_finite(self, ("dropout",))
        filters = tuple(tuple(int(v) for v in f) for f in self.filters) if isinstance(self.filters, (list, tuple)) \
            else self.filters
        object.__setattr__(self, "filters", filters)  # JSON gives lists; the config stays hashable
        if not filters or any(len(f) != 2 or f[0] < 1 or f[1] < 1 for f in filters):
            raise ValueError(f"ElmoConfig.filters must be (width, count) pairs of positive integers, got "
                             f"{self.filters!r}")
        check_fields(self, ("vocab_size", "char_vocab_size", "max_characters", "char_embedding_dim",
                            "projection_dim", "lstm_dim", "num_layers"), "positive integer")
        if self.max_characters < max(w for w, _ in filters):
            raise ValueError(f"ElmoConfig.max_characters ({self.max_characters}) is narrower than the widest "
                             f"filter ({max(w for w, _ in filters)})")
        if self.lstm_dim < self.projection_dim:
            raise ValueError(f"ElmoConfig.lstm_dim ({self.lstm_dim}) must be at least projection_dim "
                             f"({self.projection_dim})")
        check_fields(self, ("num_highway",), "non-negative integer")
        check_fields(self, ("cell_clip", "proj_clip"), "positive number or None")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"ElmoConfig.dropout must be in [0, 1), got {self.dropout!r}")
        if not isinstance(self.sampled_softmax, int) or not 0 <= self.sampled_softmax < self.vocab_size:
            raise ValueError(f"ElmoConfig.sampled_softmax must be 0 (full softmax) or a number of samples below "
                             f"vocab_size ({self.vocab_size}), got {self.sampled_softmax!r}")
        check_token_ids(self, ("pad_token_id",))


    @property
    def hidden_size(self) -> int:
        """Width of every layer ELMo outputs: 2P (the token layer is its P-wide vector twice, as in bilm-tf)."""
        return 2 * self.projection_dim

    @property
    def cnn_dim(self) -> int:
        """Width of the char-CNN output (the filters' counts summed)."""
        return sum(n for _, n in self.filters)

    def to_dict(self) -> dict[str, Any]:
        return {**self.field_dict(), "filters": [list(f) for f in self.filters], "model_type": "elmo"}

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "ElmoConfig":
        return cls.build(cls.read_fields(data, source), source)
