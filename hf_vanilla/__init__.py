"""hf_vanilla: the original Transformer (Vaswani et al., 2017) as a Hugging Face transformers model.

Importing the package registers ``vanilla_transformer`` with ``AutoConfig``, ``AutoModel`` and
``AutoModelForSeq2SeqLM``, and the ``vanilla-translation`` pipeline with transformers' pipeline registry:
``pipeline("vanilla-translation", model=folder)`` then needs no ``trust_remote_code``, as ``AutoModel...``.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM
from transformers.pipelines import PIPELINE_REGISTRY

from hf_vanilla.models.vanilla_transformer.configuration_vanilla_transformer import (
    PRESETS,
    VanillaTransformerConfig,
)
from hf_vanilla.models.vanilla_transformer.modeling_vanilla_transformer import (
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
    VanillaTransformerPreTrainedModel,
)
from hf_vanilla.models.vanilla_transformer.pipeline_vanilla_transformer import TASK as PIPELINE_TASK
from hf_vanilla.models.vanilla_transformer.pipeline_vanilla_transformer import VanillaTranslationPipeline

__version__ = "0.1.0"

AutoConfig.register(VanillaTransformerConfig.model_type, VanillaTransformerConfig, exist_ok=True)
AutoModel.register(VanillaTransformerConfig, VanillaTransformerModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(
    VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, exist_ok=True
)
if PIPELINE_TASK not in PIPELINE_REGISTRY.supported_tasks:
    PIPELINE_REGISTRY.register_pipeline(
        PIPELINE_TASK, pipeline_class=VanillaTranslationPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
    )
# A folder's config.json lists the pipeline under custom_pipelines (for where hf_vanilla is not installed);
# here the registered one is used, with no trust_remote_code, as for the model classes.
VanillaTransformerConfig.registered_pipelines = (PIPELINE_TASK,)

__all__ = [
    "PIPELINE_TASK",
    "PRESETS",
    "VanillaTransformerConfig",
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerModel",
    "VanillaTransformerPreTrainedModel",
    "VanillaTranslationPipeline",
    "__version__",
]
