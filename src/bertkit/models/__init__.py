"""Every architecture bertkit builds, one file each, sharing the attention layouts (`layouts.py`) and the kernel
choices (`kernels.py`): `bert.py` (BERT, RoBERTa, ALBERT, ELECTRA, DistilBERT, causal: one set of classes) and
`heads.py` (the task models)."""

from bertkit.config import IGNORE_INDEX, BertConfig, ElmoConfig, ModernBertConfig, T5Config, XLNetConfig
from bertkit.models.elmo import ElmoLanguageModel, ElmoModel, ElmoOutput
from bertkit.models.bert import (BertForCausalLM, BertForMaskedLM, BertForPreTraining, BertForReplacedTokenDetection,
                                 BertModel, BertOutput, ElectraOutput, GeneratorDiscriminator, PreTrainedModel,
                                 PreTrainingOutput, TaskOutput, check_inputs, compile_layers, generator_config_for,
                                 set_fast_paths)
from bertkit.models.heads import (BertForMultipleChoice, BertForQuestionAnswering, BertForSequenceClassification,
                                  BertForTokenClassification)
from bertkit.models.kernels import Linear, linear
from bertkit.models.layouts import Encoded, Padded, Unpadded
from bertkit.models.modernbert import (ModernBertForMaskedLM, ModernBertForMultipleChoice,
                                       ModernBertForQuestionAnswering, ModernBertForSequenceClassification,
                                       ModernBertForTokenClassification, ModernBertModel)
from bertkit.models.t5 import (DecoderCache, Seq2SeqOutput, T5EncoderModel, T5EncoderOutput,
                               T5ForConditionalGeneration)
from bertkit.models.xlnet import (XLNetForMultipleChoice, XLNetForQuestionAnswering, XLNetForSequenceClassification,
                                  XLNetForTokenClassification, XLNetLMHeadModel, XLNetModel)

__all__ = ["ElmoLanguageModel", "ElmoModel", "ElmoOutput", "ModernBertForMaskedLM", "ModernBertForMultipleChoice", "ModernBertForQuestionAnswering",
           "ModernBertForSequenceClassification", "ModernBertForTokenClassification", "ModernBertModel",
           "DecoderCache", "Seq2SeqOutput", "T5EncoderModel", "T5EncoderOutput", "T5ForConditionalGeneration",
           "IGNORE_INDEX", "BertForCausalLM", "BertForMaskedLM", "BertForMultipleChoice", "BertForPreTraining",
           "BertForQuestionAnswering", "BertForReplacedTokenDetection", "BertForSequenceClassification",
           "BertForTokenClassification", "BertModel", "Encoded", "Padded", "Unpadded", "BertOutput", "ElectraOutput", "GeneratorDiscriminator",
           "Linear", "PreTrainedModel", "PreTrainingOutput", "TaskOutput", "check_inputs", "compile_layers",
           "generator_config_for", "linear", "set_fast_paths", "XLNetForMultipleChoice", "XLNetForQuestionAnswering",
           "XLNetForSequenceClassification", "XLNetForTokenClassification", "XLNetLMHeadModel", "XLNetModel",
           "ROLE_CLASSES", "ROLE_NAMES", "class_for",
           "ModelDir", "model_class"]

# The class each use loads a model directory as, by the config class its config.json reads as (BertConfig for the
# whole BERT family): "pretraining" (fill-mask, pretraining; BERT's has the NSP head), "mlm" (the masked-LM model
# alone: MLM distillation), "encoder" (features), and the task models "sequence", "token", "choice" (SWAG) and "qa".
ROLE_CLASSES: dict[type, dict[str, type]] = {
    BertConfig: {"pretraining": BertForPreTraining, "mlm": BertForMaskedLM, "encoder": BertModel,
                 "sequence": BertForSequenceClassification, "token": BertForTokenClassification,
                 "choice": BertForMultipleChoice, "qa": BertForQuestionAnswering},
    ModernBertConfig: {"pretraining": ModernBertForMaskedLM, "mlm": ModernBertForMaskedLM, "encoder": ModernBertModel,
                       "sequence": ModernBertForSequenceClassification, "token": ModernBertForTokenClassification,
                       "choice": ModernBertForMultipleChoice, "qa": ModernBertForQuestionAnswering},
    # T5 has no masked-LM or classifier heads: every task is text to text ("seq2seq": the encoder-decoder).
    T5Config: {"encoder": T5EncoderModel, "seq2seq": T5ForConditionalGeneration},
    # XLNet pretrains by permutation LM ("pretraining": the LM head model); it has no masked-LM model.
    XLNetConfig: {"pretraining": XLNetLMHeadModel, "encoder": XLNetModel, "sequence": XLNetForSequenceClassification,
                  "token": XLNetForTokenClassification, "choice": XLNetForMultipleChoice,
                  "qa": XLNetForQuestionAnswering},
}
# ELMo: a biLM whose layers are features ("encoder"); its task models are bertkit.features' frozen-encoder models.
ROLE_CLASSES[ElmoConfig] = {"pretraining": ElmoLanguageModel, "encoder": ElmoModel}
# Embedding models (bertkit.tasks.embed): an encoder with sentence-transformers' pooling.
from bertkit.models.pooling import SentenceEncoder  # noqa: E402

for _row in (ROLE_CLASSES[BertConfig], ROLE_CLASSES[ModernBertConfig]):
    _row["embedding"] = SentenceEncoder
# How errors name a role.
ROLE_NAMES = {"pretraining": "pretraining", "mlm": "masked-LM", "encoder": "bare encoder",
              "sequence": "sequence-classification", "token": "token-classification", "choice": "multiple-choice",
              "qa": "question-answering", "embedding": "sentence-embedding", "seq2seq": "text-to-text (encoder-decoder)"}


def class_for(config, role: str, what: str = "") -> type:
    """The model class of `role` (a key of ROLE_CLASSES' rows) for a model of `config` (any config class).

    Raises ValueError naming the model type and the role when bertkit has no such model for that architecture
    (`what`: the directory or verb, for the message)."""
    row = ROLE_CLASSES.get(type(config), {})
    if role not in row:
        where = f" ({what})" if what else ""
        raise ValueError(f"bertkit has no {ROLE_NAMES.get(role, role)} model for model_type "
                         f"{config.model_type!r}{where}")
    return row[role]


# The one model-directory reader (it reads this module's role table lazily; re-exported last for that reason).
from bertkit.models.modeldir import ModelDir, model_class  # noqa: E402
