"""Every architecture bertkit builds, one file each, sharing the attention layouts (`layouts.py`) and the kernel
choices (`kernels.py`): `bert.py` (BERT, RoBERTa, ALBERT, ELECTRA, DistilBERT, causal: one set of classes) and
`heads.py` (the task models)."""

from bertkit.config import IGNORE_INDEX, BertConfig, ModernBertConfig
from bertkit.models.bert import (BertForCausalLM, BertForMaskedLM, BertForPreTraining, BertForReplacedTokenDetection,
                                 BertModel, BertOutput, ElectraOutput, GeneratorDiscriminator, PreTrainedModel,
                                 PreTrainingOutput, TaskOutput, check_inputs, compile_layers, generator_config_for,
                                 set_fast_paths)
from bertkit.models.heads import (BertForMultipleChoice, BertForQuestionAnswering, BertForSequenceClassification,
                                  BertForTokenClassification)
from bertkit.models.kernels import Linear, linear
from bertkit.models.layouts import Encoded, Padded, Unpadded
from bertkit.models.modernbert import (ModernBertForMaskedLM, ModernBertForSequenceClassification,
                                       ModernBertForTokenClassification, ModernBertModel)
from bertkit.models.t5 import (DecoderCache, Seq2SeqOutput, T5EncoderModel, T5EncoderOutput,
                               T5ForConditionalGeneration)

__all__ = ["ModernBertForMaskedLM", "ModernBertForSequenceClassification", "ModernBertForTokenClassification",
           "ModernBertModel", "DecoderCache", "Seq2SeqOutput", "T5EncoderModel", "T5EncoderOutput",
           "T5ForConditionalGeneration",
           "IGNORE_INDEX", "BertForCausalLM", "BertForMaskedLM", "BertForMultipleChoice", "BertForPreTraining",
           "BertForQuestionAnswering", "BertForReplacedTokenDetection", "BertForSequenceClassification",
           "BertForTokenClassification", "BertModel", "Encoded", "Padded", "Unpadded", "BertOutput", "ElectraOutput", "GeneratorDiscriminator",
           "Linear", "PreTrainedModel", "PreTrainingOutput", "TaskOutput", "check_inputs", "compile_layers",
           "generator_config_for", "linear", "set_fast_paths", "ROLE_CLASSES", "model_class"]

# The class each use loads a model directory as, by the config class its config.json reads as (BertConfig for the
# whole BERT family): "pretraining" (fill-mask), "encoder" (features), "sequence" and "token" (classifiers).
ROLE_CLASSES: dict[type, dict[str, type]] = {
    BertConfig: {"pretraining": BertForPreTraining, "encoder": BertModel,
                   "sequence": BertForSequenceClassification, "token": BertForTokenClassification},
    ModernBertConfig: {"pretraining": ModernBertForMaskedLM, "encoder": ModernBertModel,
                         "sequence": ModernBertForSequenceClassification, "token": ModernBertForTokenClassification},
}


def model_class(directory, role: str) -> type:
    """The model class that loads `directory` (a model directory) for `role` (a key of ROLE_CLASSES' rows)."""
    from bertkit.checkpoint import CONFIG_NAME, config_from_dict, read_config

    config = config_from_dict(read_config(directory), source=f"{directory}/{CONFIG_NAME}")
    return ROLE_CLASSES[type(config)][role]
