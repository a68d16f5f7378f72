"""hf_vanilla: the original Transformer (Vaswani et al., 2017) as a Hugging Face transformers model.

Importing the package registers ``vanilla_transformer`` with ``AutoConfig``, ``AutoModel`` and
``AutoModelForSeq2SeqLM`` (there the model class with the installed package's speed work,
:mod:`hf_vanilla.speed`), and the ``vanilla-translation`` pipeline with transformers' pipeline registry:
``pipeline("vanilla-translation", model=folder)`` then needs no ``trust_remote_code``, as ``AutoModel...``.

The import itself is light (no torch, no transformers): the registration runs as soon as transformers'
Auto classes or pipelines are imported (at once if they already are), and the public names below are
imported on first use. A command's ``--help`` therefore answers without loading torch (but
``hf-vanilla-train``'s: its options include transformers' training arguments; docs/performance.md).

On a transformers release outside the range the model code supports, the import stops with one line naming
that range and the fix.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__version__ = "0.1.0"

_MODELS = "hf_vanilla.models.vanilla_transformer"


def _check_transformers() -> None:
    """Run the model code's check of the installed transformers release. The supported range and its test live
    in the configuration file, which imports transformers; they are read from its source
    (:func:`hf_vanilla.models.model_file_definitions`), so that the import stays light."""
    from hf_vanilla.models import model_file_definitions

    check = model_file_definitions(
        "configuration_vanilla_transformer.py",
        frozenset({"TRANSFORMERS_REQUIREMENT", "check_transformers_version"}),
    )["check_transformers_version"]
    try:
        version = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        version = "(not installed)"
    check(version)


_check_transformers()

#: Public name -> the module it is defined in (imported by :func:`__getattr__` on first use).
_PUBLIC = {
    "PRESETS": f"{_MODELS}.configuration_vanilla_transformer",
    "VanillaTransformerConfig": f"{_MODELS}.configuration_vanilla_transformer",
    "VanillaTransformerForConditionalGeneration": "hf_vanilla.speed.modeling",
    "VanillaTransformerModel": f"{_MODELS}.modeling_vanilla_transformer",
    "VanillaTransformerPreTrainedModel": f"{_MODELS}.modeling_vanilla_transformer",
    "VanillaTranslationPipeline": f"{_MODELS}.pipeline_vanilla_transformer",
}


def __getattr__(name: str) -> Any:
    if name == "PIPELINE_TASK":
        return importlib.import_module(f"{_MODELS}.pipeline_vanilla_transformer").TASK
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'hf_vanilla' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


def _importing(name: str) -> bool:
    """Whether our module defining the public ``name`` is being imported (it imports transformers, whose
    import runs a registration that needs it): the registration then waits for it to complete."""
    module = sys.modules.get(_PUBLIC[name])
    return module is not None and not hasattr(module, name)


def _register_config() -> None:
    if _importing("VanillaTransformerConfig"):
        return
    from transformers import AutoConfig

    from hf_vanilla.models.vanilla_transformer.configuration_vanilla_transformer import (
        VanillaTransformerConfig,
    )

    AutoConfig.register(VanillaTransformerConfig.model_type, VanillaTransformerConfig, exist_ok=True)


def _register_models() -> None:
    if any(
        _importing(name)
        for name in (
            "VanillaTransformerConfig",
            "VanillaTransformerModel",
            "VanillaTransformerForConditionalGeneration",
        )
    ):
        return
    from transformers import AutoModel, AutoModelForSeq2SeqLM

    from hf_vanilla.models.vanilla_transformer.configuration_vanilla_transformer import (
        VanillaTransformerConfig,
    )
    from hf_vanilla.models.vanilla_transformer.modeling_vanilla_transformer import VanillaTransformerModel
    from hf_vanilla.speed.modeling import VanillaTransformerForConditionalGeneration

    AutoModel.register(VanillaTransformerConfig, VanillaTransformerModel, exist_ok=True)
    AutoModelForSeq2SeqLM.register(
        VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, exist_ok=True
    )


def _register_pipeline() -> None:
    if _importing("VanillaTranslationPipeline"):
        return
    from transformers import AutoModelForSeq2SeqLM
    from transformers.pipelines import PIPELINE_REGISTRY

    from hf_vanilla.models.vanilla_transformer.pipeline_vanilla_transformer import TASK as PIPELINE_TASK
    from hf_vanilla.models.vanilla_transformer.pipeline_vanilla_transformer import VanillaTranslationPipeline

    if PIPELINE_TASK not in PIPELINE_REGISTRY.supported_tasks:
        PIPELINE_REGISTRY.register_pipeline(
            PIPELINE_TASK,
            pipeline_class=VanillaTranslationPipeline,
            pt_model=AutoModelForSeq2SeqLM,
            type="text",
        )
    # A folder's config.json lists the pipeline under custom_pipelines (for where hf_vanilla is not
    # installed); here the registered one is used, with no trust_remote_code, as for the model classes.
    from hf_vanilla.models.vanilla_transformer.configuration_vanilla_transformer import (
        VanillaTransformerConfig,
    )

    VanillaTransformerConfig.registered_pipelines = (PIPELINE_TASK,)


#: transformers module -> the registration to run once it is imported.
_REGISTRATIONS: dict[str, Callable[[], None]] = {
    "transformers.models.auto.configuration_auto": _register_config,
    "transformers.models.auto.modeling_auto": _register_models,
    "transformers.pipelines": _register_pipeline,
    _PUBLIC["VanillaTransformerConfig"]: _register_config,
    _PUBLIC["VanillaTransformerForConditionalGeneration"]: _register_models,
    _PUBLIC["VanillaTransformerModel"]: _register_models,
    _PUBLIC["VanillaTranslationPipeline"]: _register_pipeline,
}


class _RegisterAfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs a registration of :data:`_REGISTRATIONS` right after its transformers module is imported."""

    def __init__(self, loader: importlib.abc.Loader, registration: Callable[[], None]) -> None:
        self.loader, self.registration = loader, registration

    @classmethod
    def find_spec(
        cls, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        registration = _REGISTRATIONS.get(fullname)
        if registration is None:
            return None
        for finder in sys.meta_path:
            if finder is cls or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = cls(spec.loader, registration)
                return spec
        return None

    @classmethod
    def invalidate_caches(cls) -> None:
        """Nothing is cached (``importlib.invalidate_caches()`` calls this on every finder in sys.meta_path)."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        if _REGISTRATIONS.pop(module.__name__, None) is not None:
            self.registration()


def _register_when_imported() -> None:
    for name, registration in list(_REGISTRATIONS.items()):
        if name in sys.modules:  # transformers came first: register now
            del _REGISTRATIONS[name]
            registration()
    if _REGISTRATIONS and _RegisterAfterImport not in sys.meta_path:
        sys.meta_path.insert(0, _RegisterAfterImport)


_register_when_imported()

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
