"""The web demo (hf_vanilla.demo.app): its functions without a browser, and the real page in headless Chromium."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("gradio", reason="the web demo needs the `demo` extra: pip install -e '.[demo]'")

from helpers import Outputs, tiny_model

from hf_vanilla.analysis.plotting import token_labels
from hf_vanilla.data.tokenization import train_bpe_tokenizer
from hf_vanilla.demo.app import (
    ATTENTION_ID,
    BUTTON_ID,
    EXAMPLES_ID,
    SOURCE_ID,
    TRANSLATION_ID,
    build_demo,
    load_for_demo,
    translate_with_attention,
)
from hf_vanilla.hub.folder import save_model_folder
from hf_vanilla.hub.record import TRAINING_RECORD_JSON, write_training_record

SENTENCE = "Die Brücke über den Fluß ist schön."
#: What the fixture's folder records it was trained on (the page lists them).
TRAINED_ON = ["Der Hund ist grün.", "Die Katze schläft."]
TITLE = "A tiny German test model"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny model with a byte-level BPE over German words, written as every hf_vanilla folder."""
    tokenizer = train_bpe_tokenizer(
        [SENTENCE, "Der Hund ist grün.", "Die Katze schläft."] * 20, vocab_size=320
    )
    model = tiny_model(seed=3, vocab_size=len(tokenizer))
    model.generation_config.max_new_tokens = 8  # a random model rarely stops by itself: keep the test short
    folder = save_model_folder(model, tokenizer, tmp_path_factory.mktemp("app") / "model")
    write_training_record(folder, trained_with="a test", title=TITLE, example_sources=TRAINED_ON)
    return folder


def test_translates_with_the_models_defaults_and_draws_readable_attention(model_folder: Path) -> None:
    model, tokenizer = load_for_demo(model_folder)
    assert model.config._attn_implementation == "eager"  # SDPA gives no attention weights
    translation, figure = translate_with_attention(model, tokenizer, f"  {SENTENCE}\n")

    encoded = tokenizer(SENTENCE, return_tensors="pt")
    with torch.no_grad():
        generated = model.generate(**encoded)[0]  # the generation config: beam 4, α 0.6, its length bound
    assert translation == tokenizer.decode(generated, skip_special_tokens=True)

    (ax, _colorbar) = figure.axes
    source_labels = [label.get_text() for label in ax.get_xticklabels()]
    target_labels = [label.get_text() for label in ax.get_yticklabels()]
    assert source_labels == token_labels(tokenizer, encoded["input_ids"][0])
    assert source_labels[:2] == ["Die", "Brücke"] and source_labels[-1] == "</s>"
    assert target_labels == token_labels(tokenizer, generated[1:][generated[1:] != 0])
    assert not any("Ġ" in label or "Ã" in label for label in source_labels + target_labels)


def test_blank_input_gives_nothing(model_folder: Path) -> None:
    model, tokenizer = load_for_demo(model_folder)
    assert translate_with_attention(model, tokenizer, " \n ") == ("", None)


def _page(model_folder: Path) -> tuple[dict[str, dict], str]:
    """The page's components by element id, and all its text."""
    components = [c.get("props", {}) for c in build_demo(model_folder).get_config_file()["components"]]
    text = " ".join(str(p["value"]) for p in components if isinstance(p.get("value"), str))
    return {p["elem_id"]: p for p in components if p.get("elem_id")}, text


def test_the_page_has_its_parts_and_enter_translates(model_folder: Path) -> None:
    props, text = _page(model_folder)
    assert {SOURCE_ID, BUTTON_ID, TRANSLATION_ID, ATTENTION_ID} <= set(props)
    # Gradio submits a textbox on Enter only when it has one line (more lines: Enter is a newline)
    assert props[SOURCE_ID]["lines"] == 1 and props[SOURCE_ID]["max_lines"] == 1
    assert "Press Enter" in text


def test_the_page_shows_the_sentences_its_folder_records(model_folder: Path) -> None:
    props, text = _page(model_folder)
    assert [sample[0] for sample in props[EXAMPLES_ID]["samples"]] == TRAINED_ON
    assert TITLE in text


def test_a_folder_that_records_no_examples_says_so(model_folder: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(model_folder, bare, ignore=shutil.ignore_patterns(TRAINING_RECORD_JSON))
    props, text = _page(bare)
    assert EXAMPLES_ID not in props
    assert "records no sentences it was trained on" in text


@pytest.mark.slow
@pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM} (Debian: apt-get install -y chromium)"
)
def test_the_page_in_headless_chromium(model_folder: Path, tmp_path: Path) -> None:
    """Start `python -m hf_vanilla.cli.app`, see the recorded examples, type a sentence in Chromium and
    press Enter, read the translation back."""
    playwright = pytest.importorskip("playwright.sync_api", reason="the browser test needs `playwright`")
    model, tokenizer = load_for_demo(model_folder)
    expected, _ = translate_with_attention(model, tokenizer, SENTENCE)
    assert expected, "the random model's translation is empty: pick another seed for the fixture"

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", "OMP_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1"}  # fmt: skip
    # No --port: Gradio binds the first free port from 7860 (a taken one fails to bind and is skipped, so
    # no port is probed and then reused) and prints the address once the page answers.
    server = subprocess.Popen(
        [sys.executable, "-m", "hf_vanilla.cli.app", "--model", str(model_folder)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    served = Outputs(server)
    try:  # importing gradio alone takes a minute on a busy machine
        url = served.wait_for(r"Running on local URL:\s+(http://\S+)", timeout=300).group(1)
        with playwright.sync_playwright() as driver:
            browser = driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page()
                page.goto(url, timeout=60_000)
                playwright.expect(page.get_by_text(TRAINED_ON[0])).to_be_visible(timeout=30_000)
                box = page.locator(f"#{SOURCE_ID}").get_by_role("textbox")
                box.click()
                box.press_sequentially(SENTENCE)  # as a visitor types, key by key
                box.press("Enter")
                output = page.locator(f"#{TRANSLATION_ID} textarea")
                playwright.expect(output).to_have_value(expected, timeout=60_000)
                playwright.expect(page.locator(f"#{ATTENTION_ID} img")).to_be_visible(timeout=30_000)
            finally:
                browser.close()
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        finally:
            server.kill()


def test_the_earlier_releases_paths_still_serve_the_demo() -> None:
    """``python -m hf_vanilla.app`` (the README's command before the package split) is ``hf-vanilla-app``,
    and ``from hf_vanilla.app import build_demo`` is the page's own function."""
    result = subprocess.run(
        [sys.executable, "-m", "hf_vanilla.app", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
        check=True,
    )
    assert "--model" in result.stdout and "--port" in result.stdout
    import hf_vanilla.app
    import hf_vanilla.demo.app

    assert hf_vanilla.app.build_demo is hf_vanilla.demo.app.build_demo
