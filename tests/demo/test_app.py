"""The web demo (hf_vanilla.demo.app): its functions without a browser, and the real page in headless Chromium."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

pytest.importorskip("gradio", reason="the web demo needs the `demo` extra: pip install -e '.[demo]'")

from helpers import tiny_model

from hf_vanilla.analysis.plotting import token_labels
from hf_vanilla.data.tokenization import train_bpe_tokenizer
from hf_vanilla.demo.app import (
    ATTENTION_ID,
    BUTTON_ID,
    SOURCE_ID,
    TRANSLATION_ID,
    build_demo,
    load_for_demo,
    translate_with_attention,
)
from hf_vanilla.hub.folder import save_model_folder

SENTENCE = "Die Brücke über den Fluß ist schön."
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
    return save_model_folder(model, tokenizer, tmp_path_factory.mktemp("app") / "model")


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


def test_the_page_has_its_parts(model_folder: Path) -> None:
    config = build_demo(model_folder).get_config_file()
    ids = {component.get("props", {}).get("elem_id") for component in config["components"]}
    assert {SOURCE_ID, BUTTON_ID, TRANSLATION_ID, ATTENTION_ID} <= ids


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
@pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM} (Debian: apt-get install -y chromium)"
)
def test_the_page_in_headless_chromium(model_folder: Path, tmp_path: Path) -> None:
    """Start `python -m hf_vanilla.cli.app`, type a sentence in Chromium, read the translation back."""
    playwright = pytest.importorskip("playwright.sync_api", reason="the browser test needs `playwright`")
    model, tokenizer = load_for_demo(model_folder)
    expected, _ = translate_with_attention(model, tokenizer, SENTENCE)
    assert expected, "the random model's translation is empty: pick another seed for the fixture"

    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", "OMP_NUM_THREADS": "1"}
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "hf_vanilla.cli.app", "--model", str(model_folder), "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 300  # importing gradio alone takes a minute on a busy machine
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            try:
                urllib.request.urlopen(url, timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the app did not answer within 300 s"
                time.sleep(0.5)
        with playwright.sync_playwright() as driver:
            browser = driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page()
                page.goto(url, timeout=60_000)
                page.locator(f"#{SOURCE_ID} textarea").fill(SENTENCE)
                page.locator(f"#{BUTTON_ID}").click()
                output = page.locator(f"#{TRANSLATION_ID} textarea")
                playwright.expect(output).to_have_value(expected, timeout=60_000)
                playwright.expect(page.locator(f"#{ATTENTION_ID} img")).to_be_visible(timeout=30_000)
            finally:
                browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
