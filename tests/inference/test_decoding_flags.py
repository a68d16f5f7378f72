"""hf-vanilla-translate's MT-toolkit decoding flags: target prefixes (forced decoding)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import tiny_model, word_tokenizer

from hf_vanilla.hub.folder import save_model_folder
from hf_vanilla.inference.decoding import DecodingOptions
from hf_vanilla.inference.loading import InferenceModelArguments, load_model_and_tokenizer
from hf_vanilla.inference.translation import TargetPrefixError, translate, translate_nbest

GREEDY = DecodingOptions(num_beams=1)
LINES = ["w4 w5", "", "w1 w2 w3", "w6 w7 w8 w9 w10", "w7"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model folder whose random model's outputs differ by input (larger tied embeddings)."""
    model = tiny_model(seed=2)
    with torch.no_grad():
        model.model.shared.weight.mul_(3)
    path = tmp_path_factory.mktemp("decoding_flags") / "model"
    save_model_folder(model, word_tokenizer(), path)
    return path


def _load(folder: Path) -> tuple[object, object]:
    args = InferenceModelArguments(model_name_or_path=str(folder), device="cpu")
    return load_model_and_tokenizer(args, allow_ctranslate2=True)


@pytest.mark.parametrize("options", [GREEDY, DecodingOptions(num_beams=3)], ids=["greedy", "beam"])
def test_a_target_prefix_starts_the_output_and_the_rest_is_decoded(
    folder: Path, options: DecodingOptions
) -> None:
    model, tokenizer = _load(folder)
    plain = translate(model, tokenizer, LINES, options, batch_size=2)
    prefixes = ["w90 w91", "", "", "w92", " "]  # prefixes of different lengths in one call; blank = none
    forced = translate(model, tokenizer, LINES, options, batch_size=2, prefixes=prefixes)
    assert forced[0].split()[:2] == ["w90", "w91"] and forced[3].split()[:1] == ["w92"]
    assert forced[0] != plain[0] and forced[3] != plain[3]  # the rest is decoded after the prefix
    assert forced[1:3] == plain[1:3] and forced[4] == plain[4]  # a blank prefix is no prefix
    # Greedy decoding forced along its own output goes on as it would have: the prefix is decoded from,
    # not just pasted in front (positions and cache follow it).
    if options.num_beams == 1:
        own = [" ".join(line.split()[:k]) for line, k in zip(plain, (3, 0, 0, 2, 1), strict=True)]
        assert translate(model, tokenizer, LINES, options, prefixes=own) == plain
    # The whole output (prefix included) keeps the length bound.
    longest = translate(
        model, tokenizer, ["w4"], options, prefixes=["w3 " * 40], generate_kwargs={"max_new_tokens": 45}
    )
    assert len(longest[0].split()) <= 44


def test_target_prefixes_are_refused_in_one_line_naming_the_line(folder: Path) -> None:
    model, tokenizer = _load(folder)
    with pytest.raises(
        TargetPrefixError, match=r"--target_prefix_file, line 1: the prefix has 5 tokens.*at most 4"
    ):
        translate_nbest(model, tokenizer, ["w4"], GREEDY, prefixes=["w1 w2 w3 w4 w5"],
                        generate_kwargs={"max_new_tokens": 5})  # fmt: skip
    with pytest.raises(TargetPrefixError, match="line 2: a prefix for a blank input line"):
        translate(model, tokenizer, ["w4", ""], GREEDY, prefixes=["", "w1"])
    with pytest.raises(ValueError, match="--target_prefix_file has 1 line"):
        translate(model, tokenizer, ["w4", "w5"], GREEDY, prefixes=["w1"])


def test_the_cli_reads_target_prefixes_and_refuses_a_misaligned_file(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from hf_vanilla.cli.translate import main

    (tmp_path / "in.txt").write_text("w4 w5\n\nw7\n")
    (tmp_path / "prefix.txt").write_text("w90 w91\n\n\n")
    base = ["--model_name_or_path", str(folder), "--num_beams", "1", "--input_file", str(tmp_path / "in.txt")]
    assert (
        main(
            [
                *base,
                "--target_prefix_file",
                str(tmp_path / "prefix.txt"),
                "--output_file",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    out = (tmp_path / "out").read_text().splitlines()
    assert len(out) == 3 and out[0].startswith("w90 w91") and out[1] == ""
    capsys.readouterr()
    (tmp_path / "short.txt").write_text("w90\n")
    assert (
        main(
            [
                *base,
                "--target_prefix_file",
                str(tmp_path / "short.txt"),
                "--output_file",
                str(tmp_path / "o2"),
            ]
        )
        == 1
    )
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --target_prefix_file") and "has 1 line(s)" in err and "\n" not in err
    assert not (tmp_path / "o2").exists()
    (tmp_path / "long.txt").write_text("\n\n" + "w1 " * 60 + "\n")
    assert (
        main(
            [*base, "--target_prefix_file", str(tmp_path / "long.txt"), "--output_file", str(tmp_path / "o3")]
        )
        == 1
    )
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the loading bar
    assert err.startswith(
        f"error: --target_prefix_file {tmp_path / 'long.txt'}, line 3: the prefix has 60 tokens"
    )


def test_both_backends_force_the_same_greedy_prefixes(folder: Path) -> None:
    pytest.importorskip("ctranslate2")
    from hf_vanilla.interop.export_ctranslate2 import export_ctranslate2

    ct2 = export_ctranslate2(folder, folder.parent / "ct2")
    prefixes = ["w90 w91", "", "w3", "w92", ""]
    outputs = [translate(*_load(path), LINES, GREEDY, prefixes=prefixes) for path in (folder, Path(ct2))]
    assert outputs[0] == outputs[1] and outputs[0][0].startswith("w90 w91")
