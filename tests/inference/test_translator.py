"""The Translator class for batch engines: every batch kind gives hf-vanilla-translate's output, bad batches
are refused in one line, and Ray Data's map_batches runs it as it is on a local Ray instance (slow tier)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from helpers import varied_model_folder

from hf_vanilla.cli.translate import main
from hf_vanilla.inference.options import DecodingOptions
from hf_vanilla.inference.translator import Translator

LINES = ["w4 w5", "", "w1 w2 w3", "w6 w7 w8 w9 w10", "w7", "\ufeffw5 w6", "w11 w12 w13"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return varied_model_folder(tmp_path_factory.mktemp("translator") / "model")


@pytest.fixture(scope="module")
def expected(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """hf-vanilla-translate's output for :data:`LINES`, beam 2, at most 6 tokens."""
    root = tmp_path_factory.mktemp("cli")
    (root / "in.txt").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    args = ["--model_name_or_path", str(folder), "--device", "cpu", "--num_beams", "2", "--max_length", "6"]
    assert main([*args, "--input_file", str(root / "in.txt"), "--output_file", str(root / "out.txt")]) == 0
    return (root / "out.txt").read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def translator(folder: Path) -> Translator:
    return Translator(
        str(folder), decoding=DecodingOptions(num_beams=2), max_length=6, device="cpu", batch_size=3
    )


def test_every_batch_kind_gives_the_command_s_translations(
    translator: Translator, expected: list[str]
) -> None:
    assert len(set(expected)) > 3  # the lines translate differently: a row out of place would show
    assert translator(LINES) == expected
    columns = translator({"id": np.arange(len(LINES)), "text": np.array(LINES, dtype=object)})
    assert list(columns) == ["id", "text", "translation"] and columns["translation"].tolist() == expected
    frame = translator(pd.DataFrame({"text": LINES, "id": range(len(LINES))}))
    assert list(frame.columns) == ["text", "id", "translation"] and frame["translation"].tolist() == expected
    table = translator(pa.table({"text": LINES}))
    assert (
        table.column_names == ["text", "translation"] and table.column("translation").to_pylist() == expected
    )


def test_the_texts_can_come_in_another_column(folder: Path, expected: list[str]) -> None:
    named = Translator(
        str(folder),
        decoding=DecodingOptions(num_beams=2),
        max_length=6,
        device="cpu",
        column="en",
        output_column="de",
    )
    assert named({"en": np.array(LINES)})["de"].tolist() == expected


@pytest.mark.parametrize(
    ("batch", "fragment"),
    [
        ({"sentence": np.array(["w4"])}, "no column 'text' (it has ['sentence'])"),
        (pd.DataFrame({"text": ["w4"], "translation": ["x"]}), "already has a column 'translation'"),
        (pd.DataFrame({"text": ["w4", None]}), "row 1 of the batch: column 'text' holds"),
        ({"text": np.array([1.5])}, "holds 1.5, not text"),
    ],
)
def test_a_batch_it_cannot_translate_is_refused_in_one_line(
    translator: Translator, batch: object, fragment: str
) -> None:
    with pytest.raises(ValueError) as raised:
        translator(batch)
    assert fragment in str(raised.value) and "\n" not in str(raised.value)


def test_a_batch_of_another_type_is_refused(translator: Translator) -> None:
    with pytest.raises(TypeError, match="a list of texts, a dict of columns"):
        translator(np.array(LINES))


def _cli(
    folder: Path,
    root: Path,
    lines: list[str],
    *flags: str,
    prefixes: list[str] | None = None,
    aligned: bool = False,
) -> list[str]:
    """hf-vanilla-translate's output lines for ``lines`` with ``flags``, a --target_prefix_file of
    ``prefixes``, and where ``aligned`` its --alignment_file lines after them."""
    (root / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    argv = ["--model_name_or_path", str(folder), "--device", "cpu", *flags, "--overwrite"]
    argv += ["--input_file", str(root / "in.txt"), "--output_file", str(root / "out.txt")]
    if prefixes is not None:
        (root / "prefixes.txt").write_text("\n".join(prefixes) + "\n", encoding="utf-8")
        argv += ["--target_prefix_file", str(root / "prefixes.txt")]
    if aligned:
        argv += ["--alignment_file", str(root / "alignments.txt")]
    assert main(argv) == 0
    outputs = (root / "out.txt").read_text(encoding="utf-8").splitlines()
    return outputs + ((root / "alignments.txt").read_text(encoding="utf-8").splitlines() if aligned else [])


def test_prefixes_and_alignments_come_and_go_as_columns(folder: Path, tmp_path: Path) -> None:
    """A prefix column and an alignment column give the command's --target_prefix_file output and its
    --alignment_file lines, in every batch kind."""
    prefixes = ["w9", "", "", "w30 w31", "", "", "w2"]
    expected = _cli(
        folder, tmp_path, LINES, "--num_beams", "2", "--max_length", "6", prefixes=prefixes, aligned=True
    )
    translations, alignments = expected[: len(LINES)], expected[len(LINES) :]
    assert translations[0].startswith("w9") and translations[3].startswith("w30 w31")
    assert alignments[1] == "" and all(alignments[i] for i in (0, 3, 4))
    translator = Translator(
        str(folder), decoding=DecodingOptions(num_beams=2), max_length=6, device="cpu", batch_size=3,
        prefix_column="prefix", alignment_column="alignment",
    )  # fmt: skip
    frame = translator(pd.DataFrame({"text": LINES, "prefix": prefixes}))
    assert frame["translation"].tolist() == translations and frame["alignment"].tolist() == alignments
    table = translator(pa.table({"text": LINES, "prefix": prefixes}))
    assert table.column_names == ["text", "prefix", "translation", "alignment"]
    assert table.column("alignment").to_pylist() == alignments
    columns = translator({"text": np.array(LINES, dtype=object), "prefix": np.array(prefixes, dtype=object)})
    assert columns["translation"].tolist() == translations
    assert translator.translate(LINES, prefixes) == translations


def test_sentence_splitting_and_ensembles_are_the_command_s(folder: Path, tmp_path: Path) -> None:
    pytest.importorskip("pysbd")
    paragraphs = ["w4 w5. w7!  w6 w7 w8?", "", "w9 w10"]
    split = Translator(str(folder), decoding=DecodingOptions(num_beams=2), device="cpu", split_sentences="en")
    assert split(paragraphs) == _cli(
        folder, tmp_path, paragraphs, "--num_beams", "2", "--split_sentences", "en"
    )
    other = varied_model_folder(tmp_path / "other", seed=5)
    ensembled = Translator(
        str(folder), decoding=DecodingOptions(num_beams=2), device="cpu", ensemble=str(other)
    )
    expected = _cli(folder, tmp_path, LINES, "--num_beams", "2", "--ensemble", str(other))
    assert ensembled(LINES) == expected
    assert expected != _cli(folder, tmp_path, LINES, "--num_beams", "2")  # the second model counted


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        (
            {"split_sentences": "en", "prefix_column": "p"},
            "split_sentences joins one translation per sentence",
        ),
        ({"split_sentences": "xx"}, "pysbd splits"),
        ({"output_column": "text"}, "repeat a name"),
    ],
)
def test_options_that_cannot_work_are_refused_before_loading(
    tmp_path: Path, options: dict[str, str], fragment: str
) -> None:
    pytest.importorskip("pysbd")
    with pytest.raises(ValueError, match=fragment):
        Translator(str(tmp_path / "no model here"), **options)


def test_a_missing_prefix_column_is_refused(folder: Path) -> None:
    translator = Translator(str(folder), device="cpu", prefix_column="prefix")
    with pytest.raises(ValueError, match="no column 'prefix'"):
        translator(pd.DataFrame({"text": ["w4"]}))
    with pytest.raises(ValueError, match="A list of texts has no columns for 'prefix'"):
        translator(["w4"])


def test_bad_prefixes_are_refused_by_row(folder: Path) -> None:
    """A prefix that leaves no room for </s> is named by its row, not by the command's flag."""
    translator = Translator(str(folder), device="cpu", prefix_column="prefix")
    with pytest.raises(ValueError, match=r"^row 1 of the batch: its target prefix: the prefix has 60 tokens"):
        translator({"text": ["w4", "w5"], "prefix": ["", "w2 " * 60]})
    with pytest.raises(ValueError, match=r"^1 prefixes for 2 texts"):
        translator.translate(["w4", "w5"], ["w1"])


@pytest.mark.slow
def test_ray_data_map_batches_gives_the_command_s_output(
    folder: Path, expected: list[str], tmp_path: Path
) -> None:
    """The program of docs/scaling.md on a local Ray instance of 2 CPUs: 2 translator actors, batches of 3,
    blank lines kept, the input's order kept."""
    ray = pytest.importorskip("ray")
    source = tmp_path / "corpus.en"
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        context = ray.data.DataContext.get_current()
        context.execution_options.preserve_order = True
        dataset = ray.data.read_text(
            str(source), drop_empty_lines=False
        ).map_batches(
            Translator,
            fn_constructor_kwargs={
                "model_name_or_path": str(folder),
                "decoding": DecodingOptions(num_beams=2),
                "max_length": 6,
                "device": "cpu",
            },
            batch_size=3,
            compute=ray.data.ActorPoolStrategy(size=2),
            num_cpus=0.5,  # 2 actors of 1 CPU each would leave none for the read tasks: they would wait for ever
        )
        rows = dataset.take_all()
    finally:
        ray.shutdown()
    assert [row["text"] for row in rows] == LINES
    assert [row["translation"] for row in rows] == expected
