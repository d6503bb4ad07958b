"""Every architecture bertkit builds, one file each, sharing the attention layouts (`layouts.py`) and the kernel
choices (`kernels.py`): `bert.py` (BERT, RoBERTa, ALBERT, ELECTRA, DistilBERT, causal: one set of classes) and
`heads.py` (the task models)."""

from bertkit.config import IGNORE_INDEX
from bertkit.models.bert import (BertForCausalLM, BertForMaskedLM, BertForPreTraining, BertForReplacedTokenDetection,
                                 BertModel, BertOutput, ElectraOutput, GeneratorDiscriminator, PreTrainedModel,
                                 PreTrainingOutput, TaskOutput, check_inputs, compile_layers, generator_config_for,
                                 set_fast_paths)
from bertkit.models.heads import (BertForMultipleChoice, BertForQuestionAnswering, BertForSequenceClassification,
                                  BertForTokenClassification)
from bertkit.models.kernels import Linear, linear
from bertkit.models.layouts import Encoded, Padded, Unpadded

__all__ = ["IGNORE_INDEX", "BertForCausalLM", "BertForMaskedLM", "BertForMultipleChoice", "BertForPreTraining",
           "BertForQuestionAnswering", "BertForReplacedTokenDetection", "BertForSequenceClassification",
           "BertForTokenClassification", "BertModel", "Encoded", "Padded", "Unpadded", "BertOutput", "ElectraOutput", "GeneratorDiscriminator",
           "Linear", "PreTrainedModel", "PreTrainingOutput", "TaskOutput", "check_inputs", "compile_layers",
           "generator_config_for", "linear", "set_fast_paths"]
