"""transformers' model contract, checked on hf_vanilla and HF's own ``MarianMTModel`` side by side.

Both models are built at the same tiny size with the same layer names (hf_vanilla with attention
biases, as Marian has). Each contract check is a function ``check(side) -> observation`` in
``CHECKS``; it asserts what must hold for one model and returns what both must share.
``test_check_holds`` runs every check on each side; ``test_sides_agree`` compares the two
observations, after ``DIFFERENCES`` has asserted (and removed) each difference that is by design.
A new check is one function added to ``CHECKS``; it must return an observation (``test_sides_agree``
refuses ``None``, which two sides would always share).
"""

from __future__ import annotations

import copy
import inspect
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from tempfile import TemporaryDirectory

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import MarianConfig, MarianModel, MarianMTModel, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import EncoderDecoderCache

from hf_vanilla import (
    VanillaTransformerConfig,
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
)

TINY = {
    "vocab_size": 100,
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 3,  # different from the encoder, so that text configs show which side they are
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 8,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "max_position_embeddings": 64,
}
SEPARATE_VOCABULARIES = {"share_encoder_decoder_embeddings": False, "decoder_vocab_size": 80}
BATCH, BEAMS, NEW_TOKENS = 2, 3, 4


@dataclass(frozen=True)
class Side:
    """One model family: how to build its config, bare model and model with the LM head."""

    name: str
    config: Callable[..., PretrainedConfig]
    base: type[PreTrainedModel]
    lm: type[PreTrainedModel]
    #: state-dict keys only this family has (its layout, not the contract), by sharing mode.
    own_keys: Callable[[str, bool], bool]

    def model(self, seed: int = 0, attn: str = "eager", **overrides: object) -> PreTrainedModel:
        torch.manual_seed(seed)
        config = self.config(**overrides)
        config._attn_implementation = attn
        return self.lm(config).eval()


VANILLA = Side(
    "hf_vanilla",
    lambda **overrides: VanillaTransformerConfig(**{**TINY, "attention_bias": True, **overrides}),
    VanillaTransformerModel,
    VanillaTransformerForConditionalGeneration,
    # `shared` is always the source embedding; Marian has no `shared` when the vocabularies differ.
    lambda key, share: not share and key.endswith("shared.weight"),
)
MARIAN = Side(
    "marian",
    lambda **overrides: MarianConfig(
        **{
            **TINY,
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "decoder_start_token_id": 1,
            "forced_eos_token_id": None,
            "activation_function": "relu",
            "scale_embedding": True,
            **overrides,
        }
    ),
    MarianModel,
    MarianMTModel,
    lambda key, share: "embed_positions" in key,  # Marian stores its sinusoid table
)
SIDES = (VANILLA, MARIAN)


def inputs() -> dict[str, torch.Tensor]:
    """Two source rows, the second padded."""
    input_ids = torch.randint(3, 80, (BATCH, 6), generator=torch.Generator().manual_seed(0))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 4:] = 0
    return {"input_ids": input_ids.masked_fill(attention_mask == 0, 0), "attention_mask": attention_mask}


def shapes(value: object) -> object:
    """The nested structure of a generate() field with tensors replaced by their shapes."""
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    if isinstance(value, (tuple, list)):
        return tuple(shapes(item) for item in value)
    return type(value).__name__


# --------------------------------------------------------------------------------------------------
# The checks
# --------------------------------------------------------------------------------------------------
def check_text_configs(side: Side) -> object:
    """``get_text_config(decoder=True / encoder=True)``: each side's own sizes (generation reads
    the decoder side's ``vocab_size``)."""
    names = ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers")
    seen = {}
    for label, overrides in (("shared", {}), ("separate", SEPARATE_VOCABULARIES)):
        config = side.config(**overrides)
        for part in ("decoder", "encoder"):
            text_config = config.get_text_config(**{part: True})
            seen[label, part] = tuple(getattr(text_config, name) for name in names)
    target = 80
    assert seen["shared", "decoder"] == (100, 32, 8, 3)
    assert seen["separate", "decoder"] == (target, 32, 8, 3)
    assert seen["shared", "encoder"] == seen["separate", "encoder"] == (100, 32, 4, 2)
    return seen


def check_loading_reports(side: Side) -> object:
    """``from_pretrained(..., output_loading_info=True)`` for every tie/share setting, both classes,
    from a checkpoint with no weights, one without the embedding and one with an extra key; the
    missing weights are initialised, and nothing is left on the meta device."""
    seen = {}
    for share in (True, False):
        for tie in (True, False):
            overrides = {"tie_word_embeddings": tie, **({} if share else SEPARATE_VOCABULARIES)}
            for cls in (side.base, side.lm):
                torch.manual_seed(0)
                model = cls(side.config(**overrides))
                with TemporaryDirectory() as folder:
                    model.save_pretrained(folder)
                    weights = Path(folder, "model.safetensors")
                    full = load_file(weights)
                    cases = {
                        "empty": {},
                        "no_embedding": {
                            k: v for k, v in full.items() if "embed_tokens" not in k and "shared" not in k
                        },
                        "extra_key": {**full, "extra.weight": torch.zeros(2)},
                    }
                    for case, state in cases.items():
                        save_file(state, weights, metadata={"format": "pt"})
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")
                            loaded, info = cls.from_pretrained(folder, output_loading_info=True)
                        on_meta = [
                            name
                            for name, tensor in [*loaded.named_parameters(), *loaded.named_buffers()]
                            if tensor.device.type == "meta"
                        ]
                        assert on_meta == [], (case, on_meta)
                        assert all(p.isfinite().all() for p in loaded.parameters())
                        embedding = loaded.get_input_embeddings().weight
                        assert loaded.get_encoder().embed_tokens.weight is embedding
                        one_matrix = loaded.get_decoder().embed_tokens.weight is embedding
                        missing = {k for k in info["missing_keys"] if not side.own_keys(k, share)}
                        assert (missing == set()) == (case == "extra_key")
                        assert info["unexpected_keys"] == ({"extra.weight"} if case == "extra_key" else set())
                        seen[share, tie, cls is side.lm, case] = (
                            frozenset(missing),
                            frozenset(info["unexpected_keys"]),
                            one_matrix if share else None,
                        )
    return seen


def check_cache_names(side: Side) -> object:
    """The cache goes in as ``cache`` (``past_key_values`` is its deprecated name) and comes back
    as ``cache``, an ``EncoderDecoderCache``; ``past_key_values`` reads the same object."""
    model = side.model()
    parameters = inspect.signature(model.forward).parameters
    assert "cache" in parameters and "past_key_values" not in parameters
    batch = inputs()
    decoder_input_ids = torch.tensor([[1, 5, 6]] * BATCH)
    with torch.no_grad():
        output = model(**batch, decoder_input_ids=decoder_input_ids, use_cache=True)
    assert isinstance(output.cache, EncoderDecoderCache)
    assert output.past_key_values is output.cache and output["cache"] is output.cache
    return sorted(output.keys())


def check_old_cache_name_warns(side: Side) -> object:
    """``past_key_values=`` gives the same result as ``cache=`` with one FutureWarning, transformers'
    deprecation message (the model name aside)."""
    model = side.model()
    batch = inputs()
    decoder_input_ids = torch.tensor([[1, 5, 6]] * BATCH)
    with torch.no_grad():
        first = model(**batch, decoder_input_ids=decoder_input_ids[:, :2], use_cache=True)
        expected = model(
            **batch, decoder_input_ids=decoder_input_ids[:, 2:], cache=copy.deepcopy(first.cache)
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            old = model(**batch, decoder_input_ids=decoder_input_ids[:, 2:], past_key_values=first.cache)
    torch.testing.assert_close(old.logits, expected.logits)
    assert old.cache.get_seq_length() == 3
    messages = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    assert len(messages) == 1, messages
    return messages[0].replace(type(model).__name__, "<model>")


def _generate(side: Side, attn: str = "eager", **kwargs: object) -> dict[str, object]:
    """generate() with every output requested; the shapes of each field (the cache aside)."""
    model = side.model(attn=attn)
    output = model.generate(
        **inputs(),
        max_new_tokens=NEW_TOKENS,
        min_new_tokens=NEW_TOKENS,
        return_dict_in_generate=True,
        output_scores=True,
        output_logits=True,
        output_attentions=True,
        output_hidden_states=True,
        **kwargs,
    )
    seen = {key: shapes(value) for key, value in output.items() if key != "cache"}
    seen["type"] = type(output).__name__
    cache = output.cache
    seen["cache rows (self, cross)"] = (
        cache.self_attention_cache.layers[0].keys.shape[0],
        cache.cross_attention_cache.layers[0].keys.shape[0],
    )
    return seen


def check_generate_logs(side: Side) -> object:
    """What ``generate()`` returning a dict (greedy and beam) logs through transformers' loggers and
    Python's warnings; ``warning_once``'s memory is cleared first, so that a message another test
    logged earlier shows again."""
    model = side.model()
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    library = logging.getLogger("transformers")
    logging.Logger.warning_once.cache_clear()  # type: ignore[attr-defined]
    library.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for beams in (1, BEAMS):
                model.generate(
                    **inputs(), num_beams=beams, max_new_tokens=NEW_TOKENS, return_dict_in_generate=True
                )
    finally:
        library.removeHandler(handler)
    return sorted({record.getMessage() for record in records} | {str(w.message) for w in caught})


def check_generate_greedy(side: Side) -> object:
    seen = _generate(side, num_beams=1, do_sample=False)
    assert seen["sequences"] == (BATCH, 1 + NEW_TOKENS)
    assert seen["scores"] == ((BATCH, seen["scores"][0][1]),) * NEW_TOKENS
    return seen


def check_generate_beam(side: Side) -> object:
    seen = _generate(side, num_beams=BEAMS, num_return_sequences=2, do_sample=False)
    assert seen["sequences"] == (2 * BATCH, 1 + NEW_TOKENS)
    assert seen["beam_indices"] == (2 * BATCH, NEW_TOKENS)
    assert seen["scores"][0][0] == BATCH * BEAMS
    return seen


def check_generate_sampling(side: Side) -> object:
    torch.manual_seed(0)
    seen = _generate(side, num_beams=1, do_sample=True)
    assert seen["sequences"] == (BATCH, 1 + NEW_TOKENS)
    return seen


def check_attentions_under_sdpa(side: Side) -> object:
    """``output_attentions=True`` with the default SDPA attention: are weights returned?"""
    seen = _generate(side, attn="sdpa", num_beams=1, do_sample=False)
    return {key: seen[key] != () and seen[key][0] != () for key in ("encoder_attentions", "cross_attentions")}


def check_continue_from_cache(side: Side) -> object:
    """Greedy generate() continued from its returned cache equals one longer call."""
    model = side.model()
    batch, greedy = inputs(), {"num_beams": 1, "do_sample": False}
    new = {"max_new_tokens": NEW_TOKENS, "min_new_tokens": NEW_TOKENS}
    first = model.generate(**batch, return_dict_in_generate=True, **new, **greedy)
    continued = model.generate(**batch, decoder_input_ids=first.sequences, cache=first.cache, **new, **greedy)
    twice = {"max_new_tokens": 2 * NEW_TOKENS, "min_new_tokens": 2 * NEW_TOKENS}
    assert torch.equal(continued, model.generate(**batch, **twice, **greedy))
    return {"cache": type(first.cache).__name__, "continued": shapes(continued)}


def check_static_cache(side: Side) -> object:
    """``cache_implementation="static"`` equals the dynamic cache token for token (greedy, beam)."""
    model, seen = side.model(), {}
    for beams in (1, BEAMS):
        kwargs = {"num_beams": beams, "do_sample": False, "max_new_tokens": NEW_TOKENS}
        dynamic = model.generate(**inputs(), **kwargs)
        static = model.generate(
            **inputs(), cache_implementation="static", return_dict_in_generate=True, **kwargs
        )
        assert torch.equal(static.sequences, dynamic)
        seen[beams] = (type(static.cache.self_attention_cache).__name__, shapes(static.sequences))
    return seen


def check_compile(side: Side) -> object:
    """The model declares full-graph compilation, and a forward compiled with ``fullgraph=True`` (any
    graph break raises) decodes with a static cache exactly as the eager one. (``backend="eager"``:
    only the graph capture is checked, not inductor's code generation.)"""
    model = side.model()
    assert model._can_compile_fullgraph
    kwargs = {"num_beams": 1, "do_sample": False, "max_new_tokens": NEW_TOKENS}
    expected = model.generate(**inputs(), **kwargs)
    torch._dynamo.reset()
    model.forward = torch.compile(model.forward, fullgraph=True, backend="eager")
    try:
        compiled = model.generate(**inputs(), cache_implementation="static", **kwargs)
        assert torch.equal(compiled, expected)
        frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    finally:
        torch._dynamo.reset()
    assert frames > 0  # the compiled forward ran, as a graph
    return {"full graph declared": model._can_compile_fullgraph, "tokens": shapes(compiled)}


def check_loss_is_a_function_of_the_logits(side: Side) -> object:
    """``torch.autograd.grad(out.loss, out.logits)`` in training and in eval with gradients: a
    gradient (not None) of the logits' shape, each row summing to 0 (softmax minus a distribution),
    not all zero."""
    model, batch = side.model(), inputs()
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    seen = {}
    for mode in ("train", "eval"):
        model.train(mode == "train")
        out = model(**batch, labels=labels)
        (grad,) = torch.autograd.grad(out.loss, out.logits, allow_unused=True)
        seen[mode] = grad is not None and (
            grad.shape == out.logits.shape,
            bool(torch.allclose(grad.sum(dim=-1), torch.zeros(()), atol=1e-6)),
            bool(grad.abs().sum() > 0),
        )
    return seen


CHECKS: list[Callable[[Side], object]] = [
    check_text_configs,
    check_loading_reports,
    check_cache_names,
    check_old_cache_name_warns,
    check_generate_logs,
    check_generate_greedy,
    check_generate_beam,
    check_generate_sampling,
    check_attentions_under_sdpa,
    check_continue_from_cache,
    check_static_cache,
    check_compile,
    check_loss_is_a_function_of_the_logits,
]

#: Checks run in the slow tier only: dynamo's graph capture takes seconds per side.
SLOW_CHECKS = (check_compile,)


def _sdpa_difference(ours: dict, marian: dict) -> None:
    """docs/paper.md: hf_vanilla returns real attention weights under SDPA (that call runs the eager
    kernel); Marian returns none there and warns."""
    assert all(ours.values()) and not any(marian.values())
    ours.clear(), marian.clear()


def _shared_embedding_difference(ours: dict, marian: dict) -> None:
    """``share_encoder_decoder_embeddings=True``: hf_vanilla's encoder and decoder always look up
    one matrix; Marian (transformers 5.24) ties them only with ``tie_word_embeddings=True`` and
    otherwise keeps three matrices (``shared``, encoder, decoder), still reported under the same keys."""
    for key in ours:
        share, tie = key[0], key[1]
        *ours_report, ours_one = ours[key]
        *marian_report, marian_one = marian[key]
        assert ours_one is (True if share else None)
        assert marian_one is (tie if share else None)
        ours[key], marian[key] = tuple(ours_report), tuple(marian_report)


#: Differences by design: each asserts its difference, then removes it from both observations.
DIFFERENCES: dict[str, Callable[[dict, dict], None]] = {
    "check_loading_reports": _shared_embedding_difference,
    "check_attentions_under_sdpa": _sdpa_difference,
}


@cache
def observe(check_name: str, side_name: str) -> object:
    check = next(c for c in CHECKS if c.__name__ == check_name)
    return check(next(s for s in SIDES if s.name == side_name))


def _params(checks: list[Callable[[Side], object]], with_sides: bool) -> list:
    params = []
    for check in checks:
        for side in SIDES if with_sides else (None,):
            ids = check.__name__.removeprefix("check_") + (f"-{side.name}" if side else "")
            marks = pytest.mark.slow if check in SLOW_CHECKS else ()
            params.append(pytest.param(check.__name__, side.name if side else None, id=ids, marks=marks))
    return params


@pytest.mark.parametrize(("check_name", "side_name"), _params(CHECKS, with_sides=True))
def test_check_holds(check_name: str, side_name: str) -> None:
    observe(check_name, side_name)


@pytest.mark.parametrize(("check_name", "side_name"), _params(CHECKS, with_sides=False))
def test_sides_agree(check_name: str, side_name: None) -> None:
    ours, marian = (
        copy.deepcopy(observe(check_name, "hf_vanilla")),
        copy.deepcopy(observe(check_name, "marian")),
    )
    assert ours is not None and marian is not None, f"{check_name} observes nothing to compare"
    if check_name in DIFFERENCES:
        DIFFERENCES[check_name](ours, marian)
    assert ours == marian
