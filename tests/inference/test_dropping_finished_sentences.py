"""Beam and greedy search that stop decoding finished sentences return transformers' own
sequences."""

from __future__ import annotations

import pytest
import torch
from helpers import ending_model, sources

from hf_vanilla import VanillaTransformerForConditionalGeneration


def generate(
    model: VanillaTransformerForConditionalGeneration, drop: bool, **kwargs: object
) -> tuple[torch.Tensor, int]:
    """The sequences, and the decoder rows the forward passes computed in all."""
    rows = []
    forward = model.forward

    def counted(*args: object, **inner: object) -> object:
        rows.append(inner["decoder_input_ids"].shape[0])
        return forward(*args, **inner)

    model.drop_finished_sentences = drop
    model.forward = counted
    try:
        with torch.inference_mode():
            return model.generate(**kwargs), sum(rows)
    finally:
        del model.forward
        del model.drop_finished_sentences


@pytest.mark.parametrize("early_stopping", ["never", True, False])
@pytest.mark.parametrize("seed", [0, 2, 3])
def test_same_sequences_fewer_rows(seed: int, early_stopping: bool | str) -> None:
    model = ending_model(seed)
    batch = sources(seed)
    kwargs = {**batch, "num_beams": 4, "early_stopping": early_stopping}
    reference, reference_rows = generate(model, False, **kwargs)
    fast, fast_rows = generate(model, True, **kwargs)
    assert torch.equal(fast, reference)
    assert fast_rows < reference_rows  # finished sentences were not computed


#: The searches that drop finished sentences.
SEARCHES = {
    "beam-4": {"num_beams": 4, "early_stopping": "never"},
    "beam-2-alpha-0": {"num_beams": 2, "early_stopping": "never", "length_penalty": 0.0},
    "greedy": {"num_beams": 1},
}
#: Row-wise options they accept, each to be compared with transformers' loop.
ROW_WISE_OPTIONS = {
    "no-repeat-ngram": {"no_repeat_ngram_size": 2},  # processors that read every hypothesis's tokens
    "repetition-min-new": {"repetition_penalty": 1.5, "min_new_tokens": 3},
    "two-eos": {"eos_token_id": [2, 5]},  # beam search keeps 3 × beams continuations per step
    "max-new-tokens": {"max_new_tokens": 4},  # every hypothesis stops at the cap
    "prompt": {"decoder_input_ids": torch.tensor([[1, 7]] * 12)},  # a longer decoder prompt
    "bound": {"max_length_offset": 3},  # many sentences end at their own §6.1 bound
}


@pytest.mark.parametrize("options", ROW_WISE_OPTIONS.values(), ids=ROW_WISE_OPTIONS)
@pytest.mark.parametrize("search", SEARCHES.values(), ids=SEARCHES)
def test_same_sequences_as_transformers_loop_with_options(
    search: dict[str, object], options: dict[str, object]
) -> None:
    """Every row-wise option the fast searches accept gives the sequences of transformers' loop."""
    model = ending_model(2)
    kwargs = {**sources(2), **search, **options}
    fast, fast_rows = generate(model, True, **kwargs)
    reference, reference_rows = generate(model, False, **kwargs)
    assert torch.equal(fast, reference)
    assert fast_rows <= reference_rows


@pytest.mark.parametrize("search", SEARCHES.values(), ids=SEARCHES)
def test_one_sentence_same_sequences(search: dict[str, object]) -> None:
    model = ending_model(0)
    kwargs = {**sources(0, sentences=1), **search}
    assert torch.equal(generate(model, True, **kwargs)[0], generate(model, False, **kwargs)[0])


def test_same_nbest_lists() -> None:
    """The n best of each sentence are the same; only hypotheses with exactly equal scores may come
    in another order (transformers' loop sorts a final list again at every later step)."""
    model = ending_model(3)
    kwargs = {**sources(3), "num_beams": 4, "num_return_sequences": 3, "length_penalty": 1.0}
    fast, reference = generate(model, True, **kwargs)[0], generate(model, False, **kwargs)[0]
    assert fast.shape == reference.shape
    for sentence in range(fast.shape[0] // 3):
        rows = slice(3 * sentence, 3 * sentence + 3)
        assert sorted(fast[rows].tolist()) == sorted(reference[rows].tolist())


def test_scores_keep_transformers_loop() -> None:
    """With scores asked for, every row's scores are returned: the search keeps transformers' loop."""
    model = ending_model(0)
    kwargs = {**sources(0), "num_beams": 4, "output_scores": True, "return_dict_in_generate": True}
    with torch.inference_mode():
        reference = model.generate(**kwargs)
    fast, rows = generate(model, True, **kwargs)
    assert torch.equal(fast.sequences, reference.sequences)
    assert rows == generate(model, False, **kwargs)[1]


# Greedy search drops a sentence as soon as it has ended.


@pytest.mark.parametrize("seed", [0, 2, 3])
def test_greedy_same_sequences_fewer_rows(seed: int) -> None:
    model = ending_model(seed)
    kwargs = {**sources(seed), "num_beams": 1}
    reference, reference_rows = generate(model, False, **kwargs)
    fast, fast_rows = generate(model, True, **kwargs)
    assert torch.equal(fast, reference)
    assert (reference == model.config.pad_token_id)[:, 1:].any()  # some sentences ended early
    assert fast_rows < reference_rows


@pytest.mark.parametrize(
    "options",
    [
        {"output_scores": True, "return_dict_in_generate": True},  # scores for every row and step
        {"streamer": "streamer"},  # every row's token at every step
        {"cache_implementation": "static"},  # transformers' loop (compiled where it compiles)
        {"do_sample": True, "top_k": 1},  # sampling
    ],
    ids=["scores", "streamer", "static-cache", "sampling"],
)
def test_greedy_keeps_transformers_loop(options: dict[str, object]) -> None:
    """Where rows are returned, streamed, held in a static cache or sampled, greedy search keeps
    transformers' loop: it computes every row to the end."""
    model = ending_model(0)
    tokens = []

    class Streamer:
        def put(self, value: torch.Tensor) -> None:
            tokens.append(value)

        def end(self) -> None:
            pass

    if "streamer" in options:
        options = {"streamer": Streamer()}
    kwargs = {**sources(0), "num_beams": 1, **options}
    fast, fast_rows = generate(model, True, **kwargs)
    reference, reference_rows = generate(model, False, **kwargs)
    assert fast_rows == reference_rows
    assert torch.equal(getattr(fast, "sequences", fast), getattr(reference, "sequences", reference))
    if "streamer" in options:
        assert all(step.shape[0] == kwargs["input_ids"].shape[0] for step in tokens[1:])


@pytest.mark.parametrize("num_beams", [1, 4])
def test_own_prepare_inputs_keeps_transformers_loop(num_beams: int) -> None:
    """The searches that drop finished sentences build a step's inputs as transformers'
    ``prepare_inputs_for_generation`` does, without calling it; a model class with its own gets it
    called at every step (transformers' loop), and the same sequences."""
    model = ending_model(0)
    calls = []

    class OwnInputs(VanillaTransformerForConditionalGeneration):
        def prepare_inputs_for_generation(self, *args: object, **kwargs: object) -> dict[str, object]:
            calls.append(1)
            return super().prepare_inputs_for_generation(*args, **kwargs)

    own = OwnInputs(model.config).eval()
    own.load_state_dict(model.state_dict())
    kwargs = {**sources(0), "num_beams": num_beams}
    reference, reference_rows = generate(model, True, **kwargs)
    sequences, rows = generate(own, True, **kwargs)
    assert torch.equal(sequences, reference)
    assert rows > reference_rows  # transformers' loop: every row to the end
    assert len(calls) > 1  # the class's own method built every step's inputs
