"""Sentence embeddings: an encoder's token vectors pooled into one vector per text, as sentence-transformers does.

`pool` computes sentence-transformers' pooling modes on a padded batch (its own rules, read from its Pooling module):

    cls                   the first real token's vector
    max                   the element-wise maximum over the real tokens
    mean                  the mean over the real tokens (special tokens included)
    mean_sqrt_len_tokens  their sum divided by sqrt(number of real tokens)
    weightedmean          the mean weighted by position 1, 2, ... (counted from the first real token)
    lasttoken             the last real token's vector

Several modes are concatenated in that order. `SentenceEncoder` is an encoder (BertModel, ModernBertModel) with a
`bertkit.sentence.SentenceConfig`: pooling, then the Dense layers, then L2 normalisation when the config says so.
It reads and writes sentence-transformers directories (`from_pretrained`, `save_pretrained`), so a model saved by
bertkit pools the same in sentence-transformers and text-embeddings-inference, and a sentence-transformers
directory pools here as it does there.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save
from torch import nn

from bertkit.checkpoint import save_model
from bertkit.models.bert import TaskOutput
from bertkit.models.modeldir import ModelDir
from bertkit.sentence import SentenceConfig, read_sentence_config, sentence_files


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, modes: tuple[str, ...]) -> torch.Tensor:
    """Sentence vectors (B, len(modes) * H) from token vectors `hidden` (B, T, H) and `attention_mask` (B, T)
    (1 = real token); padding may sit on either side. Reductions run in float32 for half-precision inputs."""
    mask = attention_mask.to(torch.bool)
    acc = torch.float32 if hidden.dtype in (torch.float16, torch.bfloat16) else hidden.dtype
    x = hidden.to(acc)
    m = mask.unsqueeze(-1).to(acc)  # (B, T, 1)
    count = m.sum(dim=1).clamp(min=1e-9)  # (B, 1) real tokens
    B, T, H = hidden.shape
    out = []
    for mode in modes:
        if mode == "cls":
            first = mask.to(torch.int).argmax(dim=1)  # the first real position (left padding moves it)
            out.append(x[torch.arange(B, device=x.device), first])
        elif mode == "max":
            out.append(x.masked_fill(~mask.unsqueeze(-1), float("-inf")).max(dim=1).values)
        elif mode == "mean":
            out.append((x * m).sum(dim=1) / count)
        elif mode == "mean_sqrt_len_tokens":
            out.append((x * m).sum(dim=1) / count.sqrt())
        elif mode == "weightedmean":
            start = mask.to(torch.int).argmax(dim=1, keepdim=True)  # (B, 1)
            weights = (torch.arange(1, T + 1, device=x.device).unsqueeze(0) - start).to(acc).unsqueeze(-1) * m
            out.append((x * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9))
        elif mode == "lasttoken":
            flipped = mask.flip(1).to(torch.int)
            found, back = flipped.max(dim=1)
            last = torch.where(found == 0, torch.full_like(back, T - 1), T - 1 - back)
            out.append((x * m)[torch.arange(B, device=x.device), last])
        else:
            raise ValueError(f"unknown pooling mode {mode!r}")
    return torch.cat(out, dim=-1).to(hidden.dtype)


class Dense(nn.Module):
    """sentence-transformers' Dense module: linear, then tanh or identity."""

    def __init__(self, in_features: int, out_features: int, bias: bool, activation: str) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=bias)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear(x)
        return torch.tanh(x) if self.activation == "tanh" else x


class SentenceEncoder(nn.Module):
    """encoder -> pool -> Dense layers -> (L2 normalise): one vector per text.

    `forward(input_ids, attention_mask, token_type_ids)` takes (B, T) or (B, C, T) integer tensors and returns a
    TaskOutput whose `logits` are the sentence vectors (B, D) or (B, C, D), so the task run's forward passes
    (`bertkit.tasks.run.forward_all`) read embeddings as they read logits.
    """

    head_family = None

    def __init__(self, encoder: nn.Module, sentence: SentenceConfig) -> None:
        super().__init__()
        self.encoder, self.sentence = encoder, sentence
        self.dense = nn.ModuleList(Dense(d.in_features, d.out_features, d.bias, d.activation) for d in sentence.dense)
        pooler = getattr(encoder, "pooler", None)
        if pooler is not None:  # BERT's pooler: kept for the directory, never read by a sentence vector, so not
            pooler.requires_grad_(False)  # trained (DistributedDataParallel wants every trained weight in the loss)

    @property
    def config(self):
        return self.encoder.config

    @property
    def dimension(self) -> int:
        """The width of the sentence vectors."""
        return self.sentence.dense[-1].out_features if self.sentence.dense else \
            len(self.sentence.modes) * self.config.hidden_size

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
              token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) ids -> (B, D) sentence vectors."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        hidden = self.encoder(input_ids, attention_mask, token_type_ids).last_hidden_state  # (B, T, H)
        x = pool(hidden, attention_mask, self.sentence.modes)
        for layer in self.dense:
            x = layer(x)
        return F.normalize(x, p=2, dim=-1) if self.sentence.normalize else x

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels=None) -> TaskOutput:
        if input_ids.dim() == 3:  # (B, C, T): every text of every example in one pass
            B, C, T = input_ids.shape
            flat = [t.reshape(B * C, T) if t is not None else None for t in (input_ids, attention_mask, token_type_ids)]
            return TaskOutput(None, self.embed(*flat).view(B, C, -1))
        return TaskOutput(None, self.embed(input_ids, attention_mask, token_type_ids))

    # ---- model directories -----------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, directory: str | Path, sentence: SentenceConfig | None = None, new_heads: bool = False,
                        **overrides) -> "SentenceEncoder":
        """A model directory as an embedding model: its sentence-transformers modules (or `sentence`, or mean
        pooling without normalisation for a plain directory), with `overrides` replacing SentenceConfig fields
        (pooling modes, normalize, matryoshka_dims; prompts are merged into the directory's). Dense weights come from each Dense folder's model.safetensors."""
        directory = Path(directory)
        sentence = sentence or read_sentence_config(directory) or SentenceConfig()
        given = {k: v for k, v in overrides.items() if v is not None}
        if "prompts" in given:  # prompts named are added to (or replace) the directory's own
            given["prompts"] = {**sentence.prompts, **given["prompts"]}
        if given:
            sentence = dataclasses.replace(sentence, **given)
        encoder = ModelDir.open(directory).load("encoder")  # without BERT's pooler where the weights have none
        model = cls(encoder, sentence)
        for layer, loaded in zip(model.dense, load_dense(directory, sentence)):
            layer.load_state_dict(loaded.state_dict())
        return model

    def save_pretrained(self, directory: str | Path, tokenizer=None) -> None:
        """The encoder's model directory (config.json, model.safetensors, tokenizer files) with the
        sentence-transformers modules beside it, written atomically together."""
        files = sentence_files(self.sentence, self.config.hidden_size)
        for spec, layer in zip(self.sentence.dense, self.dense):
            state = {k: v.detach().cpu().contiguous() for k, v in layer.state_dict().items()}
            files[f"{spec.path}/model.safetensors"] = save(state, metadata={"format": "pt"})
        save_model(self.encoder, directory, tokenizer=tokenizer, extra_files=files)


def load_dense(directory: str | Path, sentence: SentenceConfig) -> list[Dense]:
    """The Dense modules `sentence` lists, with their weights from DIRECTORY/{path}/model.safetensors."""
    from safetensors.torch import load_file

    layers = []
    for spec in sentence.dense:
        layer = Dense(spec.in_features, spec.out_features, spec.bias, spec.activation)
        path = Path(directory) / spec.path / "model.safetensors"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: the Dense module's weights are missing")
        try:
            layer.load_state_dict(load_file(str(path)), strict=True)
        except RuntimeError as err:
            raise ValueError(f"{path}: {str(err).splitlines()[0]}") from None
        layers.append(layer)
    return layers


def _int8_linear_class():
    """torch.ao's dynamic int8 Linear, run with activations quantised to the full 8 bits, and with an optional
    per-input-channel smoothing scale (`smooth`, (K,) float32: the input is multiplied by it before quantising;
    the weights were divided by it before theirs, so the product is unchanged in exact arithmetic).

    fbgemm's kernels multiply u8 activations by s8 weights; without VNNI they add pairs of products in int16,
    where 8-bit weights can overflow, which is why torch quantises activations to 7 bits (`reduce_range`), and
    that costs sentence vectors a cosine of ~0.98 to fp32 on all-MiniLM-L6-v2. Here the activations take 8 bits,
    and the weights 8 where the kernels add in int32 (`int32_accumulation`: VNNI), else 7 ([-64, 63] per output
    channel, symmetric: 2 x 255 x 64 < 2^15, no overflow)."""
    import torch.ao.nn.quantized.dynamic as qd

    class Int8Linear(qd.Linear):
        smooth: torch.Tensor | None = None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.smooth is not None:
                x = x * self.smooth
            return torch.ops.quantized.linear_dynamic(x, self._packed_params._packed_params, reduce_range=False)

    return Int8Linear


_INT32_ACCUMULATION: bool | None = None


def int32_accumulation() -> bool:
    """Whether this CPU's dynamic int8 kernels add u8 x s8 products exactly in int32 (VNNI), so that weights may
    take all 8 bits; measured once per process on the worst case for int16 pair sums (every activation 255, every
    weight 127: a pair is 64,770, past int16's 32,767), which a saturating kernel gets about half wrong."""
    global _INT32_ACCUMULATION
    if _INT32_ACCUMULATION is None:
        import warnings

        import torch.ao.nn.quantized.dynamic as qd

        with warnings.catch_warnings():  # torch 2.10+ calls its quantized tensor types deprecated; they still run
            warnings.simplefilter("ignore")
            probe = qd.Linear(64, 8, bias_=False, dtype=torch.qint8)
            weight = torch.quantize_per_channel(torch.full((8, 64), 1.0), torch.full((8,), 1 / 127),
                                                torch.zeros(8, dtype=torch.long), 0, torch.qint8)
            probe.set_weight_bias(weight, None)
            x = torch.ones(2, 64)
            x[:, 0] = -1.0  # activations quantised to [-1, 1] -> [0, 255]: every other one 255
            got = torch.ops.quantized.linear_dynamic(x, probe._packed_params._packed_params, reduce_range=False)
        _INT32_ACCUMULATION = bool(torch.allclose(got, torch.full_like(got, 62.0), rtol=0.02))
    return _INT32_ACCUMULATION


# SmoothQuant's migration strength (Xiao et al. 2023): an input channel's scale is max|x_j|^a / max|W_j|^(1-a).
# On all-MiniLM-L6-v2 (min cosine to fp32 over 768 STS-B dev sentences, calibrated on 256 others): none 0.9876,
# a=0.5 0.984, 0.6 0.9924, 0.65 0.9918, 0.7 0.9920, 0.75 0.9891, 0.85 0.971.
SMOOTH_ALPHA = 0.6


@torch.no_grad()
def input_maxima(model: nn.Module, batches) -> dict[str, torch.Tensor]:
    """{Linear module name: (K,) float32 max |input| per input channel} over `batches`, each a tuple
    (input_ids, attention_mask, token_type_ids) of (B, T) tensors passed to `model(...)` as they are."""
    maxima: dict[str, torch.Tensor] = {}
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            def record(_module, inputs, _output, name=name):
                x = inputs[0].detach().abs().reshape(-1, inputs[0].shape[-1]).amax(0).float()
                maxima[name] = torch.maximum(maxima[name], x) if name in maxima else x
            hooks.append(module.register_forward_hook(record))
    try:
        for batch in batches:
            model(*batch)
    finally:
        for hook in hooks:
            hook.remove()
    return maxima


class Bf16Linear(nn.Module):
    """A Linear layer computed in bf16 (its weights stored so, its input cast, fp32 accumulation, output back to
    fp32): on a CPU with bf16 instructions about twice as fast as fp32, and far closer to it than int8."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().to(torch.bfloat16), requires_grad=False)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().to(torch.bfloat16),
                                                                  requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(torch.bfloat16), self.weight, self.bias).to(x.dtype)


def bf16_matmuls() -> bool:
    """Whether this CPU has bf16 matmul instructions (AVX-512 BF16 or AMX), where a bf16 Linear is the faster."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def quantize_int8(model: nn.Module, keep: tuple[str, ...] = (), calibration=None,
                  alpha: float = SMOOTH_ALPHA, weight_bits: int | None = None,
                  keep_dtype: str | None = None) -> nn.Module:
    """A copy of `model` (fp32, CPU) with its Linear layers dynamically quantised: int8 weights per output channel
    (`weight_bits` of them: 8 or 7; None: 8 where `int32_accumulation()`, else 7), activations quantised per batch
    to 8 bits (`_int8_linear_class`). Embeddings and LayerNorms stay fp32; every Linear whose module name (e.g.
    "encoder.layers.5.ffn.down") ends with one of `keep` is left out of int8, computed in `keep_dtype`: "fp32",
    or "bf16" (`Bf16Linear`; None: bf16 where `bf16_matmuls()`, else fp32).

    calibration: None, or batches for `input_maxima` (a few hundred real sentences are enough): each Linear's
    input channels are then smoothed (SmoothQuant, strength `alpha`): per-tensor activation quantisation loses
    the small channels to the few large ones (BERT's LayerNorm outputs carry such outliers), so the channels are
    evened out by a per-channel scale moved into the weights, which are quantised per output channel."""
    import copy
    import warnings

    from torch.ao.quantization import PerChannelMinMaxObserver, QConfig, quantize_dynamic
    from torch.ao.quantization.observer import default_dynamic_quant_observer

    model = copy.deepcopy(model).float().eval()
    maxima = input_maxima(model, calibration) if calibration is not None else {}
    # torch.ao maps classes exactly: bertkit's Linear (an nn.Linear computed by its own kernel choice) becomes a
    # plain nn.Linear holding the same weights first.
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear) and type(child) is not nn.Linear:
                plain = nn.Linear(child.in_features, child.out_features, bias=child.bias is not None)
                plain.weight, plain.bias = child.weight, child.bias
                setattr(module, name, plain)
    chosen = {name for name, module in model.named_modules()
              if isinstance(module, nn.Linear) and not any(name.endswith(k) for k in keep)}
    smooth: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        if name in chosen and name in maxima:
            w = module.weight.detach().abs().amax(0).clamp(min=1e-5)  # (K,) max |W| per input channel
            scale = maxima[name].clamp(min=1e-5) ** alpha / w ** (1 - alpha)  # (K,)
            module.weight = nn.Parameter(module.weight.detach() * scale)
            smooth[name] = (1.0 / scale).contiguous()
    if weight_bits is None:
        weight_bits = 8 if int32_accumulation() else 7
    if weight_bits not in (7, 8):
        raise ValueError(f"weight_bits must be 7 or 8, got {weight_bits}")
    low = -(1 << (weight_bits - 1))
    weight = PerChannelMinMaxObserver.with_args(dtype=torch.qint8, qscheme=torch.per_channel_symmetric,
                                                quant_min=low, quant_max=-low - 1)
    qconfig = QConfig(activation=default_dynamic_quant_observer, weight=weight)
    with warnings.catch_warnings():  # torch 2.10+ says its quantized tensor types are deprecated; they still run
        warnings.simplefilter("ignore")
        quantized = quantize_dynamic(model, {name: qconfig for name in chosen},
                                     mapping={nn.Linear: _int8_linear_class()}, dtype=torch.qint8)
    for name, module in quantized.named_modules():
        if name in smooth:
            module.smooth = smooth[name]
    if keep_dtype is None:
        keep_dtype = "bf16" if bf16_matmuls() else "fp32"
    if keep_dtype not in ("fp32", "bf16"):
        raise ValueError(f"keep_dtype must be fp32 or bf16, got {keep_dtype!r}")
    if keep_dtype == "bf16":
        for module in list(quantized.modules()):
            for name, child in list(module.named_children()):
                if type(child) is nn.Linear:
                    setattr(module, name, Bf16Linear(child))
    return quantized


# Calibration text for `quantize_int8`'s smoothing when the caller brings none (`bertkit serve --quantize int8`):
# sentences of every kind and length, written for this purpose (none is from a benchmark set, so benchmarks of
# the int8 model measure held-out text).
CALIBRATION_TEXTS = (
    "The cat sat on the mat.",
    "How do I reset my password?",
    "A man is playing a guitar on a stage in front of a small crowd.",
    "Stock markets fell sharply on Tuesday after the central bank raised interest rates by half a point.",
    "Where is the nearest train station?",
    "The recipe calls for two cups of flour, one egg and a pinch of salt.",
    "She didn't think the meeting would last more than an hour, but it went on until late in the evening.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "Two dogs are running through a field of tall grass.",
    "Error 404: the page you requested could not be found.",
    "What is the capital of Australia?",
    "The committee approved the budget for 2025 with a vote of 7 to 2.",
    "A woman is slicing tomatoes in a kitchen.",
    "The new phone has a 6.1-inch display, 128 GB of storage and a battery that lasts all day.",
    "Please send the signed contract back by Friday.",
    "Researchers found that regular exercise lowers the risk of heart disease by about 30 percent.",
    "The children built a sandcastle near the water.",
    "Is it safe to take ibuprofen with coffee?",
    "The river flooded the lower part of the town after three days of heavy rain.",
    "I loved the film, although the ending felt rushed.",
    "Install the package with pip and import it in Python.",
    "A group of people are sitting around a table and eating dinner.",
    "The senator said she would not seek re-election next year.",
    "Temperatures will drop below freezing tonight in the northern regions.",
    "Can you recommend a good book about the history of Rome?",
    "The quick brown fox jumps over the lazy dog.",
    "Our flight was delayed by two hours because of fog at the airport.",
    "A boy is riding a bicycle down a steep hill.",
    "The company reported revenue of $4.2 billion for the third quarter, up 12% from a year earlier.",
    "He plays the piano every morning before work.",
    "Why is the sky blue?",
    "The museum's new exhibition features paintings from the Dutch Golden Age.",
    "Mix the ingredients well and bake at 180 degrees for 25 minutes.",
    "The team won the championship after a dramatic penalty shootout.",
    "A train is crossing a bridge over a wide river.",
    "Symptoms include fever, cough and shortness of breath.",
    "The software update fixes several security vulnerabilities and improves battery life.",
    "Thank you for your order; it will ship within three business days.",
    "An old man is feeding pigeons in the park.",
    "The treaty was signed in 1648, ending thirty years of war in Europe.",
    "Machine learning models need large amounts of labelled data to perform well.",
    "Turn left at the second traffic light and the hotel is on your right.",
    "Two women are talking on a bench.",
    "The price of oil rose to its highest level in six months.",
    "What time does the store open on Sundays?",
    "The volcano erupted overnight, forcing thousands of residents to leave their homes.",
    "A chef is preparing sushi in a restaurant.",
    "The library will be closed on Monday for the public holiday.",
)


def calibration_batches(tokenizer, texts=CALIBRATION_TEXTS, batch_size: int = 16, max_length: int = 128):
    """`texts` tokenised into (input_ids, attention_mask, token_type_ids) batches for `quantize_int8`."""
    pad = tokenizer.pad_id if tokenizer.pad_id is not None else 0
    encoded = tokenizer.encode_batch(list(texts), max_length=max_length)
    batches = []
    for i in range(0, len(encoded), batch_size):
        rows = encoded[i:i + batch_size]
        width = max(len(e.input_ids) for e in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        types = torch.zeros((len(rows), width), dtype=torch.long)
        for j, e in enumerate(rows):
            n = len(e.input_ids)
            ids[j, :n], mask[j, :n] = torch.tensor(e.input_ids), 1
            if e.token_type_ids:
                types[j, :n] = torch.tensor(e.token_type_ids)
        batches.append((ids, mask, types))
    return batches
