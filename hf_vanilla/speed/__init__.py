"""The installed package's speed work for the model of ``hf_vanilla.models.vanilla_transformer``.

None of it travels into a model folder: a folder loaded without hf_vanilla runs stock transformers
operators and decoding. hf_vanilla registers :class:`modeling.VanillaTransformerForConditionalGeneration`
(the folder's class with these paths switched on) with ``AutoModelForSeq2SeqLM`` when it is imported;
``HF_VANILLA_FAST_PATHS=0`` turns every path off (:mod:`fast_paths`)."""

# The model file first: its import runs hf_vanilla's registration, which imports this package's
# ``modeling`` and, through it, ``fast_paths`` and ``search``. Imported from inside one of those (a user's
# ``from hf_vanilla.speed import fast_paths`` as the first import), the registration would meet it half
# initialised.
from hf_vanilla.models.vanilla_transformer import modeling_vanilla_transformer as _modeling  # noqa: F401
