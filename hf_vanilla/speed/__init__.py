"""The installed package's speed work for the model of ``hf_vanilla.models.vanilla_transformer``.

None of it travels into a model folder: a folder loaded without hf_vanilla runs stock transformers
operators and decoding. hf_vanilla registers :class:`modeling.VanillaTransformerForConditionalGeneration`
(the folder's class with these paths switched on) with ``AutoModelForSeq2SeqLM`` when it is imported;
``HF_VANILLA_FAST_PATHS=0`` turns every path off (:mod:`fast_paths`)."""
