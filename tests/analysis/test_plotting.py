"""Pictures: cross-attention maps (§3.2.3), positional encoding (§3.5), training curves (§5.3)."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import tiny_model
from matplotlib import image as mpimg

from hf_vanilla.analysis.plotting import (
    attention_maps,
    attention_masks,
    cross_attention_for_pair,
    head_distances,
    label_smoothing_floor,
    load_log_history,
    plot_attention,
    plot_attention_grid,
    plot_attention_masks,
    plot_attention_mean,
    plot_head_distances,
    plot_positional_encoding,
    plot_training_curves,
    token_labels,
)
from hf_vanilla.data.tokenization import train_bpe_tokenizer
from hf_vanilla.models.vanilla_transformer.modeling_vanilla_transformer import smoothed_cross_entropy_sum

REPO = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

LOG_HISTORY = [
    {"step": 10, "epoch": 0.1, "loss": 7.5, "learning_rate": 1e-4, "grad_norm": 3.0},
    {"step": 20, "epoch": 0.2, "loss": 6.0, "learning_rate": 2e-4, "grad_norm": 2.0},
    {"step": 20, "epoch": 0.2, "eval_loss": 6.2, "eval_nll_loss": 5.8, "eval_ppl": 330.3, "eval_bleu": 1.5},
    {"step": 30, "epoch": 0.3, "loss": 5.1, "learning_rate": 1.6e-4, "grad_norm": 1.5},
    {"step": 40, "epoch": 0.4, "loss": 4.4, "learning_rate": 1.4e-4, "grad_norm": 1.4},
    {"step": 40, "epoch": 0.4, "eval_loss": 4.9, "eval_nll_loss": 4.3, "eval_ppl": 73.7, "eval_bleu": 6.5},
    {"step": 40, "epoch": 0.4, "train_runtime": 12.0, "train_loss": 5.7},
]


def png_pixels(path: Path) -> np.ndarray:
    """Check that ``path`` is a real, non-blank PNG and return its pixels (height, width, channels)."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert len(data) > 2_000, f"{path} is suspiciously small ({len(data)} bytes)"
    pixels = mpimg.imread(path)
    assert pixels.ndim == 3 and pixels.shape[2] in (3, 4)
    assert pixels[..., :3].var() > 0, f"{path} is blank"
    return pixels


def write_state(folder: Path, history: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "trainer_state.json"
    path.write_text(json.dumps({"global_step": 40, "log_history": history}))
    return path


# --- training curves --------------------------------------------------------------------------------


def test_training_curves_png(tmp_path: Path) -> None:
    write_state(tmp_path / "run", LOG_HISTORY)
    path = plot_training_curves(tmp_path / "run", tmp_path / "curves.png", dpi=50)
    assert png_pixels(path).shape[:2] == (200, 1000)  # figsize (20, 4) inches × 50 dpi


def test_training_curves_show_the_unsmoothed_nll_and_perplexity(tmp_path: Path) -> None:
    """eval_nll_loss and eval_ppl alone are enough to draw, and the perplexity is drawn."""
    only = [{key: row[key] for key in ("step", "eval_nll_loss", "eval_ppl")} for row in LOG_HISTORY[2::3]]
    with_ppl = png_pixels(plot_training_curves(only, tmp_path / "with.png", dpi=40))
    without = [{key: value for key, value in row.items() if key != "eval_ppl"} for row in only]
    without_ppl = png_pixels(plot_training_curves(without, tmp_path / "without.png", dpi=40))
    assert with_ppl.shape == without_ppl.shape and not np.array_equal(with_ppl, without_ppl)


def test_log_history_from_newest_checkpoint(tmp_path: Path) -> None:
    write_state(tmp_path / "run" / "checkpoint-20", LOG_HISTORY[:3])
    write_state(tmp_path / "run" / "checkpoint-100", LOG_HISTORY)
    write_state(tmp_path / "run" / "checkpoint-3", LOG_HISTORY[:1])
    assert load_log_history(tmp_path / "run") == LOG_HISTORY
    assert load_log_history(tmp_path / "run" / "checkpoint-20" / "trainer_state.json") == LOG_HISTORY[:3]


def test_training_curves_without_eval_still_draws(tmp_path: Path) -> None:
    history = [row for row in LOG_HISTORY if "loss" in row]
    png_pixels(plot_training_curves(history, tmp_path / "curves.png", dpi=40))


def test_training_curves_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"trainer_state\.json"):
        plot_training_curves(tmp_path, tmp_path / "curves.png")
    with pytest.raises(ValueError, match="logging"):
        plot_training_curves([{"step": 1, "train_runtime": 3.0}], tmp_path / "curves.png")
    with pytest.raises(ValueError, match="PNG"):
        plot_training_curves(LOG_HISTORY, tmp_path / "curves.jpg")


# --- positional encoding -----------------------------------------------------------------------------


def test_positional_encoding_png(tmp_path: Path) -> None:
    path = plot_positional_encoding(tmp_path / "pe.png", num_positions=50, d_model=64, dpi=40)
    assert png_pixels(path).shape[:2] == (200, 400)  # figsize (10, 5) × 40 dpi
    with pytest.raises(ValueError, match="even d_model"):
        plot_positional_encoding(tmp_path / "bad.png", num_positions=10, d_model=7)


# --- attention ---------------------------------------------------------------------------------------


def random_attention(layers: int, heads: int, tgt: int, src: int) -> np.ndarray:
    return np.random.default_rng(0).dirichlet(np.ones(src), size=(layers, heads, tgt))


def test_attention_grid_has_one_panel_per_layer_and_head(tmp_path: Path) -> None:
    src, tgt = ["ein", "Hund", "</s>"], ["a", "dog", "</s>"]
    small = png_pixels(
        plot_attention_grid(random_attention(1, 1, 3, 3), src, tgt, tmp_path / "1x1.png", dpi=40)
    )
    big = png_pixels(
        plot_attention_grid(random_attention(2, 4, 3, 3), src, tgt, tmp_path / "2x4.png", dpi=40)
    )
    # (heads + mean) columns × layers rows, and a caption line (0.4 inch: 16 pixels at 40 dpi)
    assert big.shape[1] == pytest.approx(small.shape[1] * 5 / 2, rel=0.02)
    assert big.shape[0] - 16 == pytest.approx((small.shape[0] - 16) * 2, rel=0.02)
    png_pixels(plot_attention_mean(random_attention(2, 4, 3, 3), src, tgt, tmp_path / "mean.png", dpi=40))


def test_attention_labels_must_match(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="one label per position"):
        plot_attention_grid(random_attention(1, 2, 3, 4), ["a"] * 3, ["b"] * 3, tmp_path / "x.png")
    with pytest.raises(ValueError, match="shape"):
        plot_attention_mean(np.ones((2, 3, 4)), ["a"] * 4, ["b"] * 3, tmp_path / "x.png")


def test_cross_attention_of_a_forced_target(model, tokenizer) -> None:
    source, target = "w1 w2 w3 w4", "w5 w6"
    attentions, source_tokens, target_tokens = cross_attention_for_pair(model, tokenizer, source, target)
    assert source_tokens == ["w1", "w2", "w3", "w4", "</s>"]
    assert target_tokens == ["w5", "w6", "</s>"]
    config = model.config
    assert attentions.shape == (config.decoder_layers, config.decoder_attention_heads, 3, 5)
    np.testing.assert_allclose(
        attentions.sum(-1), 1.0, rtol=1e-5
    )  # each query row is a softmax over the source
    assert model.training is False


def test_cross_attention_of_the_models_own_translation(model, tokenizer, tmp_path: Path) -> None:
    model.eval()
    expected, _, expected_tokens = cross_attention_for_pair(model, tokenizer, "w1 w2", max_new_tokens=3)
    model.train()  # the function must translate and attend without dropout, then restore the mode
    for _ in range(3):
        attentions, _, target_tokens = cross_attention_for_pair(model, tokenizer, "w1 w2", max_new_tokens=3)
        assert target_tokens == expected_tokens and np.array_equal(attentions, expected)
    assert model.training is True
    assert attentions.shape[2] == len(target_tokens) and 1 <= len(target_tokens) <= 3
    model.eval()
    written = plot_attention(model, tokenizer, "w1 w2 w3", tmp_path, target="w4 w5 w6", dpi=40)
    assert [path.name for path in written] == [
        "encoder_self_attention_grid.png",
        "decoder_self_attention_grid.png",
        "cross_attention_grid.png",
        "cross_attention_mean.png",
    ]
    for path in written:
        png_pixels(path)


def test_attention_maps_of_all_three_attentions(model, tokenizer) -> None:
    maps = attention_maps(model, tokenizer, "w1 w2 w3 w4", tokenizer(text_target="w5 w6")["input_ids"])
    layers, heads = model.config.encoder_layers, model.config.encoder_attention_heads
    assert maps.source_tokens == ["w1", "w2", "w3", "w4", "</s>"]
    assert maps.decoder_input_tokens == ["<s>", "w5", "w6"]  # the target shifted right
    assert maps.target_tokens == ["w5", "w6", "</s>"]
    assert maps.encoder.shape == (layers, heads, 5, 5)
    assert maps.decoder.shape == (layers, heads, 3, 3) and maps.cross.shape == (layers, heads, 3, 5)
    for weights in (maps.encoder, maps.decoder, maps.cross):
        np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
    assert not np.triu(maps.decoder, k=1).any()  # no query reads a later position
    assert np.triu(maps.decoder[..., 1:, :], k=0).any()  # the diagonal is read: the mask is not shifted


def test_attention_masks_of_a_padded_batch(model, tokenizer, tmp_path: Path) -> None:
    masks = attention_masks(model, tokenizer, [("w1 w2 w3 w4", "w5 w6 w7"), ("w1", "w5")])
    assert masks["source_tokens"][1] == ["w1", "</s>", "<pad>", "<pad>", "<pad>"]
    assert masks["decoder_input_tokens"][1] == ["<s>", "w5", "</s>", "<pad>"]
    source_keys = np.array([True, True, False, False, False])
    assert masks["encoder"][0].all() and (masks["encoder"][1] == source_keys).all()
    assert (masks["cross"][1] == source_keys).all() and masks["cross"][0].all()
    causal = np.tril(np.ones((4, 4), dtype=bool))
    assert (masks["decoder"][0] == causal).all()
    assert (masks["decoder"][1] == causal & np.array([True, True, True, False])).all()
    png_pixels(
        plot_attention_masks(
            model, tokenizer, [("w1 w2 w3", "w4 w5"), ("w1", "w5")], tmp_path / "m.png", dpi=40
        )
    )


def test_head_distances_are_zero_for_alike_heads_and_grow_for_different_ones(tokenizer) -> None:
    pairs = [("w1 w2 w3 w4", "w5 w6 w7"), ("w8 w9", "w10")]
    model = tiny_model()
    for module in model.modules():
        if hasattr(module, "q_proj"):  # every query scores every key 0: all heads attend uniformly
            module.q_proj.weight.data.zero_()  # the tiny model's projections have no bias
    uniform = head_distances(model, tokenizer, pairs)
    assert set(uniform) == {"encoder", "decoder", "cross"}
    for distances in uniform.values():
        assert distances.shape == (model.config.encoder_layers,)
        np.testing.assert_allclose(distances, 0.0, atol=1e-6)
    different = head_distances(tiny_model(), tokenizer, pairs)
    assert all((distances > 0.01).all() and (distances <= 1).all() for distances in different.values())


def test_label_smoothing_floor_is_the_least_smoothed_loss() -> None:
    vocabulary, smoothing = 50, 0.1
    best = torch.full((1, vocabulary), smoothing / vocabulary)  # the smoothed target itself
    best[0, 3] += 1 - smoothing
    floor = label_smoothing_floor(smoothing, vocabulary)
    loss = float(smoothed_cross_entropy_sum(best.log(), torch.tensor([3]), smoothing))
    assert loss == pytest.approx(floor, rel=1e-5)
    worse = float(smoothed_cross_entropy_sum(torch.zeros(1, vocabulary), torch.tensor([3]), smoothing))
    assert worse > floor and label_smoothing_floor(0.0, vocabulary) == 0.0


# --- readable token labels ------------------------------------------------------------------------

GERMAN = "Die Brücke über den Fluß ist schön grün."


def test_labels_of_whole_words_with_umlauts() -> None:
    """A byte-level BPE that learned the words: labels are the words, not `ĠbrÃ¼cke`."""
    tokenizer = train_bpe_tokenizer([GERMAN] * 50, vocab_size=400, min_frequency=1)
    ids = tokenizer(GERMAN)["input_ids"]
    raw = tokenizer.convert_ids_to_tokens(ids)
    assert any("Ã" in token for token in raw) and any(token.startswith("Ġ") for token in raw)  # what it fixes
    words = [*GERMAN[:-1].split(), "."]
    assert token_labels(tokenizer, ids) == [*words, "</s>"]


def test_labels_of_characters_split_over_tokens() -> None:
    """No merges: every byte is a token. The two bytes of `ü` both carry the label `ü`; a space is
    `␣` and bytes that are not UTF-8 are U+FFFD."""
    tokenizer = train_bpe_tokenizer(["x"], vocab_size=260)
    ids = tokenizer(" grün")["input_ids"]
    assert token_labels(tokenizer, ids) == ["␣", "g", "r", "ü", "ü", "n", "</s>"]
    umlaut_first_byte = ids[3]
    assert token_labels(tokenizer, [umlaut_first_byte, 2, ids[1]]) == ["\ufffd", "</s>", "g"]


def test_cross_attention_labels_are_readable() -> None:
    tokenizer = train_bpe_tokenizer([GERMAN] * 50, vocab_size=400, min_frequency=1)
    model = tiny_model(vocab_size=len(tokenizer))
    _, source_tokens, target_tokens = cross_attention_for_pair(
        model, tokenizer, GERMAN, "Die Brücke ist grün"
    )
    assert source_tokens == [*GERMAN[:-1].split(), ".", "</s>"]
    assert target_tokens == ["Die", "Brücke", "ist", "grün", "</s>"]


# --- the script -------------------------------------------------------------------------------------


def test_plot_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model, tokenizer) -> None:
    write_state(tmp_path / "run", LOG_HISTORY)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    argv = ["plot.py", "--output_dir", str(tmp_path / "out"), "--training_run", str(tmp_path / "run")]
    argv += ["--positional_encoding", "--model_name_or_path", str(tmp_path / "model"), "--device", "cpu"]
    argv += ["--sentence", "w1 w2", "--target", "w3", "--masks", "--dpi", "30"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(REPO / "scripts" / "plot.py"), run_name="__main__")
    assert exit_info.value.code == 0
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == [
        "attention_masks.png",
        "cross_attention_grid.png",
        "cross_attention_mean.png",
        "decoder_self_attention_grid.png",
        "encoder_self_attention_grid.png",
        "positional_encoding.png",
        "training_curves.png",
    ]
    for name in names:
        png_pixels(tmp_path / "out" / name)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--masks", "--positional_encoding"], "--masks needs --sentence"),
        (["--training_run", "run", "--label_smoothing", "0.1"], "--label_smoothing needs --training_run and"),
    ],
)
def test_plot_options_that_need_another_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from hf_vanilla.cli.plot import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


# --- what the pictures say (their figures, before they are written) --------------------------------


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each plot_* function returns its matplotlib Figure instead of writing it."""
    from hf_vanilla.analysis import plotting

    monkeypatch.setattr(plotting, "_save", lambda fig, path, dpi: fig)


def test_positional_encoding_shows_one_frequency_as_smooth_sine_and_cosine(figures) -> None:
    heat_map, curves = plot_positional_encoding("pe.png", num_positions=50, d_model=64).axes[:2]
    assert "pair index i" in heat_map.get_xlabel()  # the paper's i: columns 2i (sin) and 2i + 1 (cos)
    smooth = {
        line.get_label().split(",")[0]: line.get_ydata()
        for line in curves.lines
        if len(line.get_ydata()) > 50
    }
    assert set(smooth) == {"sin", "cos"}
    for values in smooth.values():
        assert np.abs(np.diff(values)).max() < 0.05  # drawn between the integer positions, not a zigzag
    np.testing.assert_allclose(smooth["sin"] ** 2 + smooth["cos"] ** 2, 1.0, atol=1e-6)  # one frequency


def test_head_distances_are_drawn_before_and_after_training_on_the_whole_scale(figures) -> None:
    start = {"encoder": [0.5, 0.4], "decoder": [0.3, 0.2], "cross": [0.3, 0.35]}
    trained = {"encoder": [0.6, 0.55], "decoder": [0.45, 0.5], "cross": [0.7, 0.4]}
    fig = plot_head_distances("heads.png", start, trained)
    assert [ax.get_title() for ax in fig.axes] == [
        "encoder self-attention",
        "decoder masked self-attention",
        "encoder-decoder attention",
    ]
    for ax, name in zip(fig.axes, ("encoder", "decoder", "cross"), strict=True):
        before, after = ax.containers  # one bar per layer in each
        assert [bar.get_height() for bar in before] == start[name]
        assert [bar.get_height() for bar in after] == trained[name]
        assert ax.get_ylim() == (0, 1)  # 0 = alike, 1 = no key in common: no magnified range


def test_attention_grid_names_its_axes_and_says_how_to_read_it(figures) -> None:
    fig = plot_attention_grid(
        random_attention(2, 2, 3, 4), list("abcd"), list("xyz"), "grid.png", caption="Rows sum to 1."
    )
    bottom_left = fig.axes[3]  # layer 2, head 1
    assert bottom_left.get_xlabel().startswith("key") and bottom_left.get_ylabel().startswith("query")
    assert fig._supxlabel.get_text() == "Rows sum to 1."


def test_training_curves_show_bleu_on_its_whole_scale_the_loss_floor_and_the_schedule(figures) -> None:
    history = [
        {**row, "eval_bleu": 99.4 + row["step"] / 100} if "eval_bleu" in row else row for row in LOG_HISTORY
    ]
    fig = plot_training_curves(history, "curves.png", bleu_name="character BLEU", loss_floor=0.9)
    loss, _, bleu, rate = fig.axes[:4]
    assert bleu.get_title() == "validation character BLEU (0–100)" and bleu.get_ylim()[0] == 0
    assert bleu.get_ylim()[1] >= 100  # 99.6 and 99.8 are not magnified into a slope
    assert any("label-smoothing floor 0.900" in line.get_label() for line in loss.lines)
    assert rate.get_title() == "learning rate, peak 0.0002" and "Eq. 3" not in rate.get_title()
