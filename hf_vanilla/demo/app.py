"""A web demo people can try: type a sentence, read the translation, see where the model looked.

    pip install "hf_vanilla[demo]"
    python -m hf_vanilla.cli.app --model demo_output          # or: hf-vanilla-app --model demo_output
    # → http://127.0.0.1:7860

The page (a Gradio ``Blocks`` app) loads one model folder (any folder hf_vanilla writes, or a Hub id),
lists the sentences the folder records it was trained on (``training_record.json``) as examples,
translates what is typed when Enter is pressed (or the button clicked) with the model's own decoding defaults (its ``generation_config.json``: the
paper's beam 4, α = 0.6, output ≤ input + 50) and draws the encoder-decoder attention of that
translation, averaged over layers and heads, with readable token labels
(:func:`hf_vanilla.analysis.plotting.token_labels`).

**On a Hugging Face Space** (SDK ``gradio``): put the model folder (or its Hub id) in the Space, a
``requirements.txt`` with ``hf_vanilla[demo]`` (from this repository), and an ``app.py`` of two lines::

    from hf_vanilla.demo.app import build_demo
    build_demo("model").launch()

The logic is in :func:`load_for_demo` and :func:`translate_with_attention`, which the tests call
without a browser; :func:`build_demo` only wires them to the page.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

# Set before gradio is imported: a demo page sends no usage statistics.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr
import torch
from matplotlib.figure import Figure

from hf_vanilla.analysis.plotting import attention_mean_figure, cross_attention
from hf_vanilla.hub.record import read_training_record
from hf_vanilla.inference.loading import load_model_and_tokenizer
from hf_vanilla.inference.options import InferenceModelArguments
from hf_vanilla.inference.translation import check_input_length

logger = logging.getLogger(__name__)


__all__ = ["build_demo", "load_for_demo", "recorded_examples", "translate_with_attention"]

#: Element ids of the page's parts (what a browser test or a custom stylesheet addresses).
SOURCE_ID, BUTTON_ID, TRANSLATION_ID, ATTENTION_ID = "source", "translate", "translation", "attention"
EXAMPLES_ID = "examples"


def load_for_demo(model: str | Path, device: str = "cpu") -> tuple[Any, Any]:
    """Load a model folder (or Hub id) and its tokenizer for the demo, with the eager attention
    implementation (SDPA returns no attention weights), checked to belong together."""
    return load_model_and_tokenizer(
        InferenceModelArguments(model_name_or_path=str(model), device=device), attn_implementation="eager"
    )


def translate_with_attention(model: Any, tokenizer: Any, text: str) -> tuple[str, Figure | None]:
    """Translate ``text`` with the model's decoding defaults and draw the cross-attention of that
    translation (mean over layers and heads; source tokens across, target tokens down).

    Returns ``("", None)`` for blank input; a sentence longer than the model takes raises
    :class:`hf_vanilla.inference.translation.InputTooLongError` (:func:`~hf_vanilla.inference.translation.check_input_length`). The figure is of exactly the tokens ``generate()``
    produced (the final ``</s>`` included), not of a re-tokenised translation.
    """
    text = text.strip()
    if not text:
        return "", None
    device = next(model.parameters()).device
    encoded = tokenizer(text, return_tensors="pt").to(device)
    check_input_length(model, tokenizer, encoded["input_ids"].shape[1], where="The typed sentence")
    with torch.no_grad():
        generated = model.generate(**encoded)[0]
    if int(generated[0]) == model.config.decoder_start_token_id:
        generated = generated[1:]
    target_ids = generated[generated != model.config.pad_token_id]
    translation = tokenizer.decode(target_ids, skip_special_tokens=True)
    attentions, source_tokens, target_tokens = cross_attention(model, tokenizer, text, target_ids)
    return translation, attention_mean_figure(
        attentions, source_tokens, target_tokens, title="Cross-attention"
    )


def recorded_examples(model: str | Path) -> tuple[str | None, list[str]]:
    """The title and the training sources a local model folder records (``training_record.json``,
    :mod:`hf_vanilla.hub.record`): what the page offers as examples. ``(None, [])`` for a Hub id or a
    folder that records none."""
    record = read_training_record(model) if Path(str(model)).is_dir() else None
    if record is None:
        return None, []
    return record.get("title"), list(record.get("example_sources") or [])


def build_demo(model: str | Path, device: str = "cpu", title: str | None = None) -> gr.Blocks:
    """The Gradio page for the model folder (or Hub id) ``model``; call ``.launch()`` on it."""
    loaded_model, tokenizer = load_for_demo(model, device)
    recorded_title, examples = recorded_examples(model)
    name = recorded_title or Path(str(model)).name or str(model)

    def run(text: str) -> tuple[str, Figure | None]:
        return translate_with_attention(loaded_model, tokenizer, text)

    if examples:
        knows = "Click an example below (sentences it was trained on) or type one like them."
    else:
        knows = (
            "The model folder records no sentences it was trained on (no training_record.json): it translates "
            "well only text like its training data."
        )
    with gr.Blocks(title=title or f"hf_vanilla: {name}", analytics_enabled=False) as demo:
        gr.Markdown(
            f"# {title or 'Attention Is All You Need — translation demo'}\n"
            f"Model: `{name}` (decoding: beam {loaded_model.generation_config.num_beams}, "
            f"length penalty {loaded_model.generation_config.length_penalty}). {knows} Press Enter (or "
            "the Translate button) to translate; the picture shows where the decoder looked in the source "
            "(encoder-decoder attention, mean over layers and heads)."
        )
        # One line: Enter submits (a multi-line Gradio textbox takes Enter as a newline).
        source = gr.Textbox(label="Source sentence", lines=1, max_lines=1, elem_id=SOURCE_ID)
        button = gr.Button("Translate", variant="primary", elem_id=BUTTON_ID)
        translation = gr.Textbox(label="Translation", interactive=False, elem_id=TRANSLATION_ID)
        attention = gr.Plot(label="Cross-attention", elem_id=ATTENTION_ID)
        if examples:
            gr.Examples(
                [[example] for example in examples],
                inputs=source,
                label="Sentences it was trained on",
                elem_id=EXAMPLES_ID,
            )
        for event in (button.click, source.submit):
            event(run, inputs=source, outputs=[translation, attention])
    return demo
