# Copyright 2026 The hf_vanilla authors.
# SPDX-License-Identifier: Apache-2.0 (http://www.apache.org/licenses/LICENSE-2.0)
"""A translation pipeline for hf_vanilla models, ``pipeline("vanilla-translation", ...)``.

transformers 5 removed its ``translation`` and ``text2text-generation`` pipelines (``pipeline("translation")``
now says "use text-generation with a chat model"), which do not fit an encoder-decoder trained on parallel
text. This small :class:`transformers.Pipeline` takes their place under a task name of its own:

    from transformers import pipeline

    translator = pipeline("vanilla-translation", model="path/to/model")  # trust_remote_code=True without hf_vanilla
    translator(["A man rides a bike.", "Two dogs play."], batch_size=8)
    # [{'translation_text': '...'}, {'translation_text': '...'}]
    translator("A man rides a bike.", num_beams=1, max_new_tokens=20)  # per-call generate() settings
    translator([])  # []

Decoding uses the model's ``generation_config.json`` (the paper's beam 4 and α = 0.6, output length
bounded by the input length + 50); any ``generate()`` argument given at construction or per call
overrides it. ``import hf_vanilla`` registers the task with transformers' ``PIPELINE_REGISTRY``, so
``trust_remote_code`` is not needed there; every model folder (any ``save_pretrained``, hence the Trainer
and ``push_to_hub`` too) carries this file and lists it under ``custom_pipelines`` in ``config.json``, so
the same call works where hf_vanilla is not installed (``trust_remote_code=True``). This module imports
only transformers, for that reason.
"""

from __future__ import annotations

from typing import Any

from transformers import Pipeline

__all__ = ["TASK", "VanillaTranslationPipeline"]

#: The task name the pipeline is registered under (``translation`` itself is reserved by transformers).
TASK = "vanilla-translation"


class VanillaTranslationPipeline(Pipeline):
    """Translate a string or a list of strings; each result is ``{"translation_text": str}``.

    Call arguments: ``batch_size`` (sentences per ``generate()`` call, padded together),
    ``truncation`` (cut inputs at the model's longest input, ``max_position_embeddings``; without it a
    longer input is refused), and any ``generate()`` argument (``num_beams``, ``max_new_tokens``,
    ``length_penalty``, ...).
    """

    _pipeline_calls_generate = True
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def __call__(self, inputs: str | list[str] | tuple[str, ...], *args: Any, **kwargs: Any) -> Any:
        """Translate ``inputs``: a string gives one result, a list or tuple a list of results (empty for
        an empty one, where transformers' ``Pipeline`` would end in an IndexError)."""
        if isinstance(inputs, tuple):  # transformers batches lists only
            inputs = list(inputs)
        if isinstance(inputs, list) and not inputs:
            self._sanitize_parameters(**kwargs)  # the settings are checked all the same
            return []
        return super().__call__(inputs, *args, **kwargs)

    def _sanitize_parameters(
        self, truncation: bool | None = None, **generate_kwargs: Any
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        if generate_kwargs.get("num_return_sequences", 1) != 1:
            raise ValueError(
                "This pipeline returns one translation per input; for n-best lists call model.generate() "
                "with num_return_sequences."
            )
        preprocess_params = {} if truncation is None else {"truncation": truncation}
        return preprocess_params, generate_kwargs, {}

    def preprocess(self, text: str, truncation: bool = False) -> dict[str, Any]:
        """The tokens of ``text``, refused in one line when there are more than the model's longest input
        (its ``max_position_embeddings``), as ``hf-vanilla-translate`` refuses them, unless ``truncation``
        cuts them there: the model computes positions for any length, but translates such an input badly."""
        if not isinstance(text, str):
            raise ValueError(
                f"{type(self).__name__} translates strings; got {type(text).__name__}. Pass a string or a list "
                "of strings."
            )
        limit = getattr(self.model.config, "max_position_embeddings", None)
        encoded = self.tokenizer(
            text,
            truncation=truncation,
            max_length=limit if truncation else None,
            return_tensors="pt",
            verbose=False,
        )
        length = encoded["input_ids"].shape[-1]
        if limit is not None and length > limit:
            raise ValueError(
                f"An input of {length} tokens is longer than the model's longest input of {limit} tokens (its "
                "max_position_embeddings): split the sentence, or pass truncation=True to cut it there."
            )
        return encoded

    def _forward(self, model_inputs: dict[str, Any], **generate_kwargs: Any) -> dict[str, Any]:
        # Batched inputs arrive padded by the pipeline's collate function (attention_mask included).
        return {
            "output_ids": self.model.generate(
                **model_inputs, **self._prepare_generate_kwargs(generate_kwargs)
            )
        }

    def postprocess(self, model_outputs: dict[str, Any]) -> dict[str, str]:
        (ids,) = model_outputs["output_ids"]  # one sequence per input
        return {"translation_text": self.tokenizer.decode(ids, skip_special_tokens=True)}
