# Copyright 2026 The hf_vanilla authors.
# SPDX-License-Identifier: Apache-2.0 (http://www.apache.org/licenses/LICENSE-2.0)
"""Saving the Transformer of :mod:`modeling_vanilla_transformer` as a self-contained folder.

Every ``save_pretrained`` (a user's, ``push_to_hub``'s, the stock Trainer's) writes an ``auto_map`` for
the config and both model classes and the ``custom_pipelines`` entry, and the folder holds the code
they name (hf_vanilla's, not torch's FSDP2 wrapper class), the pipeline file included (imported
relatively below, so it travels). It imports only torch and transformers: it travels with the modeling
file into a Hub folder, so a model loaded from one with ``trust_remote_code=True`` saves the same way.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from transformers import GenerationMixin, PreTrainedModel
from transformers.dynamic_module_utils import custom_object_save
from transformers.utils.loading_report import LoadStateDictInfo


def code_name(cls: type) -> str:
    """``<code file>.<class>``, how ``config.json`` names a class whose code is in the model folder."""
    return f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}"


def folder_auto_map() -> dict[str, str]:
    """``config.json``'s ``auto_map`` in every folder of this model: each Auto class → the class it
    loads, whose code file is in the folder."""
    from .configuration_vanilla_transformer import VanillaTransformerConfig
    from .modeling_vanilla_transformer import (
        VanillaTransformerForConditionalGeneration,
        VanillaTransformerModel,
    )

    return {
        "AutoConfig": code_name(VanillaTransformerConfig),
        "AutoModel": code_name(VanillaTransformerModel),
        "AutoModelForSeq2SeqLM": code_name(VanillaTransformerForConditionalGeneration),
    }


def folder_custom_pipelines() -> dict[str, dict[str, object]]:
    """``config.json``'s entry that lets ``pipeline(TASK, model=folder, trust_remote_code=True)`` find the
    pipeline class in the folder (what ``Pipeline.save_pretrained`` writes for a registered pipeline)."""
    from .pipeline_vanilla_transformer import TASK, VanillaTranslationPipeline

    return {
        TASK: {"impl": code_name(VanillaTranslationPipeline), "pt": ["AutoModelForSeq2SeqLM"], "type": "text"}
    }


@contextlib.contextmanager
def restored_auto_class_registration(model: PreTrainedModel, *config_keys: str) -> Iterator[None]:
    """On leaving, put back what was there on entering: the ``_auto_class`` registration of the model's
    and its config's classes (``register_for_auto_class`` sets it on the class) and the config's
    ``config_keys`` entries (e.g. ``auto_map``, present or absent), for
    :meth:`VanillaTransformerSavingMixin.save_pretrained`."""
    config = model.config
    classes = [
        (cls, "_auto_class" in cls.__dict__, cls.__dict__.get("_auto_class"))
        for cls in (type(model), type(config))
    ]
    entries = [(key, key in config.__dict__, config.__dict__.get(key)) for key in config_keys]
    try:
        yield
    finally:
        for cls, had, value in classes:
            if had:
                cls._auto_class = value
            elif "_auto_class" in cls.__dict__:
                del cls._auto_class
        for key, had, value in entries:
            if had:
                setattr(config, key, value)
            else:
                config.__dict__.pop(key, None)


class VanillaTransformerSavingMixin:
    """``save_pretrained`` for the model classes, and what loading reports missing (a base of
    ``VanillaTransformerPreTrainedModel``, before ``PreTrainedModel``)."""

    def save_pretrained(self, save_directory: str | os.PathLike, *args: object, **kwargs: object) -> None:
        """``PreTrainedModel.save_pretrained``, writing a folder that loads where hf_vanilla is not installed
        (``trust_remote_code=True``), whoever calls it: a user, ``push_to_hub``, the stock ``Trainer``.
        ``config.json``'s ``auto_map`` names the config and *both* model classes (AutoConfig, AutoModel,
        AutoModelForSeq2SeqLM), and for the generating model ``custom_pipelines`` names the
        ``vanilla-translation`` pipeline; the folder holds the modeling file and its relative imports
        (configuration, fast paths, generation, saving and the pipeline file, which this file imports).
        Without it a model loaded from a folder would be saved with the loaded ``auto_map`` and no code.
        The in-memory config and the classes' ``_auto_class`` are left as they were.

        Under FSDP2 the folder still holds the modeling file: ``fully_shard`` swaps the model's class for
        ``FSDP<Name>``, a subclass created in torch's ``_fsdp_init``, whose file transformers
        (``custom_object_save``) would copy and name instead; the modeling file is then added after the
        save. A user's own subclass registered with ``register_for_auto_class`` is saved the way
        transformers saves any registered class (its file); an unregistered one is saved as the hf_vanilla
        class it extends.
        """
        modeling = next(
            cls for cls in type(self).__mro__ if VanillaTransformerSavingMixin in cls.__bases__
        ).__module__
        if type(self).__module__ != modeling and "_auto_class" in type(self).__dict__:
            return super().save_pretrained(save_directory, *args, **kwargs)  # a user's registered class
        own = next(cls for cls in type(self).__mro__ if cls.__module__ == modeling)  # hf_vanilla's class
        generating = isinstance(self, GenerationMixin)
        auto_class = self._auto_class or ("AutoModelForSeq2SeqLM" if generating else "AutoModel")
        with restored_auto_class_registration(self, "auto_map", "custom_pipelines"):
            self.config.register_for_auto_class()  # AutoConfig; a class attribute
            self.config.auto_map = {
                **(self.config.__dict__.get("auto_map") or {}),
                **folder_auto_map(),
                auto_class: code_name(own),
            }
            if generating:
                self.config.custom_pipelines = {
                    **(self.config.__dict__.get("custom_pipelines") or {}),
                    **folder_custom_pipelines(),
                }
            if own is type(self):  # transformers copies the modeling file (and uploads it with push_to_hub)
                own._auto_class = auto_class
                return super().save_pretrained(save_directory, *args, **kwargs)
            if kwargs.get("push_to_hub"):
                raise ValueError(
                    f"save_pretrained(push_to_hub=True) of a {type(self).__name__} would upload the folder before "
                    "its code file is added: save it, then push the folder (hf upload REPO FOLDER .)."
                )
            type(
                self
            )._auto_class = None  # not this class's file (e.g. torch's _fsdp_init.py) but the modeling file:
            super().save_pretrained(save_directory, *args, **kwargs)
            is_main_process = args[0] if args else kwargs.get("is_main_process", True)
            if self.should_save_on_this_rank(bool(is_main_process)):
                custom_object_save(own, save_directory)

    def mark_tied_weights_as_initialized(self, loading_info: LoadStateDictInfo) -> None:
        """``PreTrainedModel.mark_tied_weights_as_initialized``, keeping a tie's missing source missing.

        While loading, transformers flags every tied *target* (``encoder.embed_tokens.weight``, ...)
        as initialised; here a target is the very Parameter of its source (``shared.weight``), so the
        source is flagged too, and for a model outside transformers every flagged key is then dropped
        from the missing keys. A checkpoint without the embedding would leave ``shared.weight``
        unreported, never initialised and on the meta device. A source that no checkpoint key loaded
        stays missing: it is reported as Marian reports it, moved off the meta device and initialised.
        """
        unloaded_sources = {
            key
            for key in set(self.all_tied_weights_keys.values()) & loading_info.missing_keys
            if not getattr(self.get_parameter_or_buffer(key), "_is_hf_initialized", False)
        }
        super().mark_tied_weights_as_initialized(loading_info)
        loading_info.missing_keys |= unloaded_sources
