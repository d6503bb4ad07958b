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
from torch import nn

from bertkit.models.bert import TaskOutput
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
    (`bertkit.taskrun.forward_all`) read embeddings as they read logits.
    """

    head_family = None

    def __init__(self, encoder: nn.Module, sentence: SentenceConfig) -> None:
        super().__init__()
        self.encoder, self.sentence = encoder, sentence
        self.dense = nn.ModuleList(Dense(d.in_features, d.out_features, d.bias, d.activation) for d in sentence.dense)

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
        (pooling modes, normalize). Dense weights come from each Dense folder's model.safetensors."""
        from bertkit.models.modeldir import ModelDir

        directory = Path(directory)
        sentence = sentence or read_sentence_config(directory) or SentenceConfig()
        given = {k: v for k, v in overrides.items() if v is not None}
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
        from safetensors.torch import save

        from bertkit.checkpoint import save_model

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
    """torch.ao's dynamic int8 Linear, run with activations quantised to the full 8 bits.

    fbgemm's kernels multiply u8 activations by s8 weights and add pairs of products in int16: with 8-bit weights
    the pair sum can overflow, which is why torch quantises activations to 7 bits there (`reduce_range`), and
    that costs sentence vectors a cosine of ~0.98 to fp32 on all-MiniLM-L6-v2. Here the weights take 7 bits
    instead ([-64, 63] per output channel, symmetric: 2 x 255 x 64 < 2^15, no overflow) and the activations 8:
    a cosine of ~0.993 at the same speed."""
    import torch.ao.nn.quantized.dynamic as qd

    class Int8Linear(qd.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.quantized.linear_dynamic(x, self._packed_params._packed_params, reduce_range=False)

    return Int8Linear


def quantize_int8(model: nn.Module) -> nn.Module:
    """A copy of `model` (fp32, CPU) with every Linear layer dynamically quantised: int8 weights (7 bits used, per
    output channel), activations quantised per batch to 8 bits (`_int8_linear_class`). Embeddings and LayerNorms
    stay fp32."""
    import copy
    import warnings

    from torch.ao.quantization import PerChannelMinMaxObserver, QConfig, quantize_dynamic
    from torch.ao.quantization.observer import default_dynamic_quant_observer

    model = copy.deepcopy(model).float().eval()
    # torch.ao maps classes exactly: bertkit's Linear (an nn.Linear computed by its own kernel choice) becomes a
    # plain nn.Linear holding the same weights first.
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear) and type(child) is not nn.Linear:
                plain = nn.Linear(child.in_features, child.out_features, bias=child.bias is not None)
                plain.weight, plain.bias = child.weight, child.bias
                setattr(module, name, plain)
    weight = PerChannelMinMaxObserver.with_args(dtype=torch.qint8, qscheme=torch.per_channel_symmetric,
                                                quant_min=-64, quant_max=63)
    qconfig = QConfig(activation=default_dynamic_quant_observer, weight=weight)
    with warnings.catch_warnings():  # torch 2.10+ says its quantized tensor types are deprecated; they still run
        warnings.simplefilter("ignore")
        return quantize_dynamic(model, {nn.Linear: qconfig}, mapping={nn.Linear: _int8_linear_class()},
                                dtype=torch.qint8)
