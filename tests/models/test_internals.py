"""Each private transformers/torch symbol listed in docs/internals.md still exists and still means what
hf_vanilla relies on. A failure names the symbol: read docs/internals.md, then adapt the code."""

from __future__ import annotations

import inspect

import pytest
import torch
import transformers
from transformers import GenerationMixin, PreTrainedModel, Trainer
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from hf_vanilla import VanillaTransformerForConditionalGeneration


def _has(owner: object, name: str) -> bool:
    return callable(getattr(owner, name, None))


CHECKS = {
    "GenerationMixin._reorder_cache hook": lambda: (
        'hasattr(self, "_reorder_cache")' in inspect.getsource(GenerationMixin._beam_search)
    ),
    "GenerationMixin._expand_inputs_for_generation": lambda: (
        _has(GenerationMixin, "_expand_inputs_for_generation")
        and "encoder_outputs" in inspect.getsource(GenerationMixin._expand_inputs_for_generation)
    ),
    "PreTrainedModel.mark_tied_weights_as_initialized": lambda: _has(
        PreTrainedModel, "mark_tied_weights_as_initialized"
    ),
    "PreTrainedModel._auto_class": lambda: hasattr(PreTrainedModel, "_auto_class"),
    "transformers.optimization._get_inverse_sqrt_schedule_lr_lambda": lambda: _has(
        transformers.optimization, "_get_inverse_sqrt_schedule_lr_lambda"
    ),
    "Trainer._save_checkpoint / _get_output_dir": lambda: (
        _has(Trainer, "_save_checkpoint") and _has(Trainer, "_get_output_dir")
    ),
    "Trainer._load_optimizer_and_scheduler(checkpoint)": lambda: (
        list(inspect.signature(Trainer._load_optimizer_and_scheduler).parameters) == ["self", "checkpoint"]
    ),
    "Trainer._issue_warnings_after_load(load_result)": lambda: (
        list(inspect.signature(Trainer._issue_warnings_after_load).parameters) == ["self", "load_result"]
        and "missing_keys" in inspect.getsource(Trainer._issue_warnings_after_load)
    ),
    "Trainer._remove_unused_columns / _get_collator_with_removed_columns": lambda: (
        _has(Trainer, "_remove_unused_columns") and _has(Trainer, "_get_collator_with_removed_columns")
    ),
    "torch.ops.mkldnn._linear_pointwise": lambda: (
        not torch.backends.mkldnn.is_available() or hasattr(torch.ops.mkldnn, "_linear_pointwise")
    ),
    "torch._C._functorch.is_functorch_wrapped_tensor": lambda: _has(
        torch._C._functorch, "is_functorch_wrapped_tensor"
    ),
    "torch.nn.modules.module._global_*_hooks": lambda: all(
        isinstance(getattr(torch.nn.modules.module, f"_global_{kind}_hooks", None), dict)
        for kind in ("forward", "forward_pre", "backward", "backward_pre")
    ),
    "Module._forward_hooks / _forward_pre_hooks / _backward_hooks / _backward_pre_hooks": lambda: all(
        isinstance(getattr(torch.nn.Linear(1, 1), name, None), dict)
        for name in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    ),
    "torch._C._will_engine_execute_node": lambda: _has(torch._C, "_will_engine_execute_node"),
    "ALL_ATTENTION_FUNCTIONS['sdpa'] is sdpa_attention_forward": lambda: (
        ALL_ATTENTION_FUNCTIONS.get_interface("sdpa", None) is sdpa_attention_forward
    ),
    "DynamicLayer.keys / values / is_initialized / lazy_initialization": lambda: (
        _has(DynamicLayer, "lazy_initialization")
        and {"keys", "values", "is_initialized"} <= set(vars(_initialized_dynamic_layer()))
    ),
}


def _initialized_dynamic_layer() -> DynamicLayer:
    layer = DynamicLayer()
    layer.update(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1))
    return layer


@pytest.mark.parametrize("symbol", list(CHECKS))
def test_private_symbol_still_holds(symbol: str) -> None:
    assert CHECKS[symbol](), (
        f"The private symbol {symbol!r} changed in this transformers/torch release; hf_vanilla relies on "
        "it (see docs/internals.md for where and why)."
    )


def test_the_model_still_overrides_the_hooks_it_relies_on() -> None:
    cls = VanillaTransformerForConditionalGeneration
    for name in ("_reorder_cache", "_expand_inputs_for_generation"):
        assert getattr(cls, name) is not getattr(GenerationMixin, name, None), name
