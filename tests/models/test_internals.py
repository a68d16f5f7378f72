"""Each private transformers/torch symbol listed in docs/internals.md still exists and still means what
hf_vanilla relies on. A failure names the symbol: read docs/internals.md, then adapt the code."""

from __future__ import annotations

import ast
import inspect

import pytest
import torch
import transformers
from transformers import GenerationConfig, GenerationMixin, Pipeline, PreTrainedModel, Trainer
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from hf_vanilla import VanillaTransformerForConditionalGeneration
from tests.helpers import ROOT


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
    "GenerationConfig._from_model_config (False keeps unknown keys)": lambda: (
        GenerationConfig(_from_model_config=False, max_length_offset=50).max_length_offset == 50
        and not hasattr(GenerationConfig(_from_model_config=True, max_length_offset=50), "max_length_offset")
    ),
    "GenerationConfig._get_default_generation_params()['max_length'] == 20": lambda: (
        GenerationConfig._get_default_generation_params().get("max_length") == 20
    ),
    "PreTrainedModel._get_resized_embeddings / _get_resized_lm_head": lambda: (
        _has(PreTrainedModel, "_get_resized_embeddings") and _has(PreTrainedModel, "_get_resized_lm_head")
    ),
    "Pipeline._prepare_generate_kwargs(generate_kwargs)": lambda: (
        "generate_kwargs" in inspect.signature(Pipeline._prepare_generate_kwargs).parameters
    ),
    "GenerationMixin search helpers (keywords hf_vanilla passes)": lambda: all(
        set(keywords) <= set(inspect.signature(getattr(GenerationMixin, name)).parameters)
        for name, keywords in SEARCH_HELPERS.items()
    ),
    "GenerationMixin._prepare_special_tokens sets _pad_token_tensor / _eos_token_tensor": lambda: (
        "_pad_token_tensor" in inspect.getsource(GenerationMixin._prepare_special_tokens)
        and "_eos_token_tensor" in inspect.getsource(GenerationMixin._prepare_special_tokens)
    ),
    "DynamicLayer.keys / values / is_initialized / lazy_initialization": lambda: (
        _has(DynamicLayer, "lazy_initialization")
        and {"keys", "values", "is_initialized"} <= set(vars(_initialized_dynamic_layer()))
    ),
}


#: The GenerationMixin helpers hf_vanilla.speed.search calls, with the keywords it passes them.
SEARCH_HELPERS = {
    "_beam_search": ("input_ids", "logits_processor", "stopping_criteria", "generation_config", "synced_gpus"),
    "_sample": ("input_ids", "logits_processor", "stopping_criteria", "generation_config", "synced_gpus", "streamer"),
    "_prefill": ("input_ids", "generation_config", "model_kwargs"),
    "_update_model_kwargs_for_generation": ("outputs", "model_kwargs", "is_encoder_decoder"),
    "_flatten_beam_dim": ("tensor",),
    "_unflatten_beam_dim": ("tensor", "batch_size", "num_beams"),
    "_get_top_k_continuations": (
        "accumulated_log_probs", "running_sequences", "running_beam_indices", "cur_len", "decoder_prompt_len",
        "do_sample", "beams_to_keep", "num_beams", "batch_size",
    ),
    "_get_running_beams_for_next_iteration": (
        "topk_log_probs", "topk_running_sequences", "topk_running_beam_indices",
        "next_token_hits_stopping_criteria", "num_beams",
    ),
    "_update_finished_beams": (
        "sequences", "topk_running_sequences", "beam_scores", "topk_log_probs", "beam_indices",
        "topk_running_beam_indices", "is_early_stop_heuristic_unsatisfied", "is_sent_finished",
        "next_token_hits_stopping_criteria", "top_num_beam_mask", "num_beams", "cur_len", "decoder_prompt_len",
        "length_penalty", "early_stopping",
    ),
    "_check_early_stop_heuristic": (
        "is_early_stop_heuristic_unsatisfied", "running_beam_scores", "beam_scores", "is_sent_finished",
        "cur_len", "max_length", "decoder_prompt_len", "early_stopping", "length_penalty",
    ),
    "_beam_search_has_unfinished_sequences": (),
    "_expand_inputs_for_generation": ("expand_size", "is_encoder_decoder", "input_ids"),
}  # fmt: skip


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


def _private_names_used_by_the_folder() -> set[str]:
    """Attributes and imported names starting with one underscore that the model-folder files use and do not
    define themselves."""
    used: set[str] = set()
    defined: set[str] = set()
    for path in (ROOT / "hf_vanilla" / "models" / "vanilla_transformer").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                defined.add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                defined |= {target.id for target in targets if isinstance(target, ast.Name)}
            elif isinstance(node, ast.Attribute):
                used.add(node.attr)
            elif isinstance(node, ast.ImportFrom):
                used |= {alias.name for alias in node.names}
    return {name for name in used - defined if name.startswith("_") and not name.startswith("__")}


def test_the_folder_uses_only_the_private_names_listed_here() -> None:
    """A model-folder file that starts using another private transformers/torch name fails here until
    docs/internals.md lists it (with a check above)."""
    folder_section = (ROOT / "docs" / "internals.md").read_text().split("## In the model folder", 1)[1]
    folder_section = folder_section.split("\n## ", 1)[0]
    assert (
        sorted(name for name in _private_names_used_by_the_folder() if f".{name}" not in folder_section) == []
    )
