"""Saving the Transformer of :mod:`modeling_vanilla_transformer` as a self-contained folder.

``save_pretrained`` after ``register_for_auto_class`` writes an ``auto_map`` for the config and both
model classes, and keeps hf_vanilla's code (not torch's FSDP2 wrapper class) in the folder. It imports
only torch and transformers: it travels with the modeling file into a Hub folder, so a model loaded
from one saves the same way.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from transformers import PreTrainedModel
from transformers.dynamic_module_utils import custom_object_save
from transformers.utils.loading_report import LoadStateDictInfo


@contextlib.contextmanager
def restored_auto_class_registration(model: PreTrainedModel, *config_keys: str) -> Iterator[None]:
    """On leaving, put back what was there on entering: the ``_auto_class`` registration of the model's
    and its config's classes (``register_for_auto_class`` sets it on the class) and the config's
    ``config_keys`` entries (e.g. ``auto_map``, present or absent). The one place that restores them,
    for :meth:`VanillaTransformerSavingMixin.save_pretrained` and ``hf_vanilla.hub``."""
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
        """``PreTrainedModel.save_pretrained``; after ``register_for_auto_class`` the saved
        ``auto_map`` names the config and *both* model classes (AutoConfig, AutoModel,
        AutoModelForSeq2SeqLM), which live in the modeling file, and the folder holds that file and its
        relative imports. The in-memory config is left as it was.

        Under FSDP2 the folder still holds the modeling file: ``fully_shard`` swaps the model's class for
        ``FSDP<Name>``, a subclass created in torch's ``_fsdp_init``, whose file transformers
        (``custom_object_save``) would copy and name instead; the modeling file is then added after the save.
        A user's own subclass is saved the way transformers saves any registered class (its file).
        """
        own = type(self)
        if own.__module__.startswith("torch.distributed.fsdp"):  # FSDP2's class: the one it wraps
            own = next(cls for cls in own.__mro__ if not cls.__module__.startswith("torch.distributed.fsdp"))
        modeling = next(
            cls for cls in own.__mro__ if VanillaTransformerSavingMixin in cls.__bases__
        ).__module__
        if self._auto_class is None or own.__module__ != modeling:
            return super().save_pretrained(save_directory, *args, **kwargs)
        module = modeling.rsplit(".", 1)[-1]
        with restored_auto_class_registration(self, "auto_map"):
            self.config.register_for_auto_class()  # AutoConfig; a class attribute
            self.config.auto_map = {
                **(self.config.__dict__.get("auto_map") or {}),
                "AutoModel": f"{module}.VanillaTransformerModel",
                "AutoModelForSeq2SeqLM": f"{module}.VanillaTransformerForConditionalGeneration",
                self._auto_class: f"{module}.{own.__name__}",
            }
            if own is type(self):  # transformers copies the modeling file (and uploads it with push_to_hub)
                return super().save_pretrained(save_directory, *args, **kwargs)
            if kwargs.get("push_to_hub"):
                raise ValueError(
                    "save_pretrained(push_to_hub=True) of an FSDP2-sharded model would upload the folder before "
                    "its code file is added: save it, then push the folder (hf upload REPO FOLDER .)."
                )
            type(self)._auto_class = None  # not torch's _fsdp_init.py: the modeling file, below
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
