"""The translate command like the toolkits': streaming stdin, n-best with scores, --max_length, --dtype,
token budgets, and a CTranslate2 backend that gives the transformers backend's output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from helpers import ROOT, tiny_model, varied_model_folder

from hf_vanilla.hub.folder import save_model_folder
from hf_vanilla.inference.ctranslate2 import CTranslate2Model
from hf_vanilla.inference.decoding import generate_hypotheses
from hf_vanilla.inference.loading import load_model_and_tokenizer
from hf_vanilla.inference.options import DecodingOptions, InferenceModelArguments
from hf_vanilla.inference.streaming import translate_stream
from hf_vanilla.inference.translation import InputTooLongError, _batches, translate, translate_nbest

GREEDY = DecodingOptions(num_beams=1)
LINES = ["w4 w5", "", "w1 w2 w3", "w6 w7 w8 w9 w10", "w7"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model folder whose random model's outputs differ by input (larger tied embeddings)."""
    return varied_model_folder(tmp_path_factory.mktemp("translate") / "model")


def _load(folder: Path, **overrides: object) -> tuple[object, object]:
    args = InferenceModelArguments(model_name_or_path=str(folder), device="cpu", **overrides)
    return load_model_and_tokenizer(args, allow_ctranslate2=True)


def _readline(stream: object, timeout: float = 60.0) -> str:
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    assert got, f"no output line within {timeout} s"
    return got[0]


def test_each_stdin_line_is_translated_as_it_arrives(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """stdin and stdout are pipes; each line's translation is read back while stdin is still open."""
    model, tokenizer = _load(folder)
    expected = translate(model, tokenizer, LINES[:2], GREEDY, generate_kwargs={"max_new_tokens": 5})
    stdin_read, stdin_write = os.pipe()
    stdout_read, stdout_write = os.pipe()
    monkeypatch.setattr(sys, "stdin", open(stdin_read, encoding="utf-8"))  # noqa: SIM115 (closed below)
    monkeypatch.setattr(sys, "stdout", open(stdout_write, "w", encoding="utf-8"))  # noqa: SIM115
    result: list[int] = []
    worker = threading.Thread(
        target=lambda: result.append(
            translate_stream(model, tokenizer, "-", "-", GREEDY, generate_kwargs={"max_new_tokens": 5})
        ),
        daemon=True,
    )
    worker.start()
    with (
        open(stdin_write, "w", encoding="utf-8") as feed,
        open(stdout_read, encoding="utf-8") as translations,
    ):
        for line, translation in zip(LINES[:2], expected, strict=True):
            feed.write(line + "\n")
            feed.flush()
            assert _readline(translations) == translation + "\n"  # before stdin is closed
        feed.close()
        worker.join(60)
    assert result == [2]
    assert expected[0] and expected[1] == ""
    sys.stdin.close()
    sys.stdout.close()


def test_nbest_lists_are_scored_sorted_and_keep_blank_lines(folder: Path, tmp_path: Path) -> None:
    model, tokenizer = _load(folder)
    (tmp_path / "in.txt").write_text("".join(line + "\n" for line in LINES))
    options = DecodingOptions(num_beams=4)
    translate_stream(model, tokenizer, tmp_path / "in.txt", tmp_path / "out.txt", options, nbest=3,
                     generate_kwargs={"max_new_tokens": 6})  # fmt: skip
    rows = [line.split("\t") for line in (tmp_path / "out.txt").read_text().splitlines()]
    assert all(len(row) == 3 for row in rows)
    assert [row[0] for row in rows] == ["0"] * 3 + ["1"] + ["2"] * 3 + ["3"] * 3 + ["4"] * 3
    assert rows[3] == ["1", "", ""]  # a blank line: no score, no translation
    best = translate(model, tokenizer, LINES, options, generate_kwargs={"max_new_tokens": 6})
    for index in (0, 2, 3, 4):
        scores = [float(row[1]) for row in rows if row[0] == str(index)]
        assert scores == sorted(scores, reverse=True)
        assert next(row[2] for row in rows if row[0] == str(index)) == best[index]


def test_a_greedy_score_is_the_length_normalised_log_probability(folder: Path) -> None:
    model, tokenizer = _load(folder)
    batch = tokenizer(["w1 w2 w3", "w9"], return_tensors="pt", padding=True)
    alpha, cap = 0.6, 6
    hypotheses = generate_hypotheses(
        model, batch.input_ids, batch.attention_mask, GREEDY, nbest=1, max_new_tokens=cap
    )
    for row, ((ids, score),) in enumerate(hypotheses):
        targets = [*ids, 2] if len(ids) < cap else ids  # ended with </s>, or cut at the cap
        decoder_input = torch.tensor([[model.config.decoder_start_token_id, *targets[:-1]]])
        mask = batch.attention_mask[row : row + 1]
        logits = model(
            input_ids=batch.input_ids[row : row + 1], attention_mask=mask, decoder_input_ids=decoder_input
        ).logits
        log_prob = logits.detach().log_softmax(-1)[0].gather(1, torch.tensor(targets)[:, None]).sum()
        assert score == pytest.approx(float(log_prob) / len(targets) ** alpha, abs=1e-4)


def test_token_budgets_change_the_batches_not_the_translations(folder: Path) -> None:
    lengths = {0: 10, 1: 6, 2: 5, 3: 2}
    assert list(_batches([0, 1, 2, 3], lengths, 64, 12)) == [[0], [1, 2], [3]]
    assert list(_batches([0, 1, 2, 3], lengths, 2, 0)) == [[0, 1], [2, 3]]
    model, tokenizer = _load(folder)
    kwargs = {"generate_kwargs": {"max_new_tokens": 4}, "options": GREEDY}
    assert translate(model, tokenizer, LINES, max_tokens=8, **kwargs) == translate(
        model, tokenizer, LINES, **kwargs
    )


def test_dtype_is_applied_or_refused_in_one_line(folder: Path) -> None:
    model, tokenizer = _load(folder, dtype="bfloat16")
    assert model.dtype == torch.bfloat16
    assert translate(model, tokenizer, ["w1 w2"], GREEDY, generate_kwargs={"max_new_tokens": 3})
    with pytest.raises(ValueError, match="both set the precision"):
        _load(folder, dtype="float16", quantization="bf16")
    with pytest.raises(ValueError, match="Unknown --dtype 'float8'"):
        _load(folder, dtype="float8")


def test_the_cli_refuses_an_nbest_wider_than_the_beam(folder: Path, capsys: pytest.CaptureFixture) -> None:
    from hf_vanilla.cli.translate import main

    assert main(["--model_name_or_path", str(folder), "--nbest", "5", "--num_beams", "4"]) == 1
    assert capsys.readouterr().err.strip() == "error: --nbest 5 needs --num_beams >= 5 (now 4)."


# --------------------------------------------------------------------------------------------------
# CTranslate2 backend
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ct2_folder(folder: Path) -> Path:
    pytest.importorskip("ctranslate2")
    from hf_vanilla.interop.export_ctranslate2 import export_ctranslate2

    return Path(export_ctranslate2(folder, folder.parent / "ct2"))


def test_both_backends_give_the_same_greedy_output_and_format(
    folder: Path, ct2_folder: Path, tmp_path: Path
) -> None:
    lines = [*LINES, " ".join(f"w{i % 96}" for i in range(63))]  # the longest input: 63 words + </s> = 64
    (tmp_path / "in.txt").write_text("".join(line + "\n" for line in lines))
    outputs = {}
    for name, path in (("hf", folder), ("ct2", ct2_folder)):
        model, tokenizer = _load(path)  # --backend auto: a folder with model.bin is a CTranslate2 export
        assert isinstance(model, CTranslate2Model) == (name == "ct2")
        if name == "ct2":  # the log names what CTranslate2 does, not transformers' beam search
            assert model.describe(GREEDY).startswith("CTranslate2 greedy")
            assert model.describe(DecodingOptions()).startswith("CTranslate2 beam 4, length penalty |Y|^0.6")
        translate_stream(
            model, tokenizer, tmp_path / "in.txt", tmp_path / f"{name}.txt", GREEDY, batch_size=3
        )
        translate_stream(model, tokenizer, tmp_path / "in.txt", tmp_path / f"{name}.nbest", GREEDY, nbest=1,
                         generate_kwargs={"max_new_tokens": 7})  # fmt: skip
        outputs[name] = (tmp_path / f"{name}.txt").read_text().splitlines()
        nbest = [line.split("\t") for line in (tmp_path / f"{name}.nbest").read_text().splitlines()]
        assert [row[0] for row in nbest] == [str(i) for i in range(len(lines))]
        outputs[name + "-nbest"] = [row[2] for row in nbest]
    assert outputs["ct2"] == outputs["hf"] and outputs["ct2-nbest"] == outputs["hf-nbest"]
    assert outputs["hf"][1] == "" and len(set(outputs["hf"])) > 2
    assert len(outputs["hf"][-1].split()) > 64  # the longest input's translation passed the encoder's table


_WITHOUT_TORCH = """
import json, sys
from hf_vanilla.cli.translate import main
status = main(sys.argv[1:])
print(json.dumps({"status": status, "torch": sorted(m for m in sys.modules if m.split(".")[0] == "torch")}))
"""


def test_the_ctranslate2_backend_translates_without_importing_torch(
    folder: Path, ct2_folder: Path, tmp_path: Path
) -> None:
    """``hf-vanilla-translate`` on a CTranslate2 export never imports torch (nor transformers' Auto
    classes, which do): the command reaches CTranslate2 in about a second, and translates as the
    transformers backend does."""
    (tmp_path / "in.txt").write_text("".join(line + "\n" for line in LINES))
    model, tokenizer = _load(folder)
    translate_stream(model, tokenizer, tmp_path / "in.txt", tmp_path / "hf.txt", GREEDY)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TORCH, "--model_name_or_path", str(ct2_folder), "--num_beams", "1",
         "--input_file", str(tmp_path / "in.txt"), "--output_file", str(tmp_path / "ct2.txt")],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["status"] == 0 and report["torch"] == [], report
    assert (tmp_path / "ct2.txt").read_text() == (tmp_path / "hf.txt").read_text()
    assert "CTranslate2 greedy (beam 1)" in done.stderr


def test_an_input_longer_than_the_model_takes_is_refused_alike(
    folder: Path, ct2_folder: Path, tmp_path: Path
) -> None:
    (tmp_path / "in.txt").write_text("w1\n" + " ".join(["w5"] * 64) + "\n")  # 65 tokens with </s>
    messages = []
    for path in (folder, ct2_folder):
        model, tokenizer = _load(path)
        assert tokenizer.model_max_length == 64
        with pytest.raises(InputTooLongError) as error:
            translate_stream(model, tokenizer, tmp_path / "in.txt", tmp_path / "out.txt", GREEDY)
        messages.append(str(error.value))
        assert not (tmp_path / "out.txt").exists()
    assert messages[0] == messages[1]
    assert messages[0].startswith(
        f"{tmp_path / 'in.txt'}, line 2: 65 tokens, more than the model's longest input of 64"
    )


def test_ctranslate2_refuses_what_it_cannot_do_in_one_line(folder: Path, ct2_folder: Path) -> None:
    import ctranslate2

    model, tokenizer = _load(ct2_folder)
    with pytest.raises(ValueError, match="gnmt needs the transformers backend"):
        translate_nbest(model, tokenizer, ["w1"], DecodingOptions(length_penalty_type="gnmt"))
    if "float16" not in ctranslate2.get_supported_compute_types("cpu"):
        with pytest.raises(ValueError, match="--dtype float16: CTranslate2 cannot compute in it on cpu"):
            _load(ct2_folder, dtype="float16")
    with pytest.raises(ValueError, match="needs the transformers model folder"):
        load_model_and_tokenizer(InferenceModelArguments(model_name_or_path=str(ct2_folder), device="cpu"))


def test_evaluate_scores_a_ctranslate2_export_and_records_its_decoding(
    folder: Path, ct2_folder: Path, tmp_path: Path
) -> None:
    """``hf-vanilla-evaluate`` on the CTranslate2 export (as its ``--backend`` help offers): greedy, the
    same hypotheses and scores as the transformers folder; the results file records CTranslate2's
    decoding (its own stopping rule, so no ``early_stopping``), not transformers' beam search."""
    from hf_vanilla.cli.evaluate_bleu import main as evaluate

    (tmp_path / "val.de").write_text("".join(line + "\n" for line in LINES if line))
    (tmp_path / "val.en").write_text("".join(line + "\n" for line in LINES if line))
    results = {}
    for name, path in (("transformers", folder), ("ctranslate2", ct2_folder)):
        arguments = ["--model_name_or_path", str(path), "--validation_files", str(tmp_path / "val")]
        arguments += ["--source_lang", "de", "--target_lang", "en", "--device", "cpu", "--num_beams", "1"]
        assert evaluate([*arguments, "--output_dir", str(tmp_path / name)]) == 0
        results[name] = json.loads((tmp_path / name / "validation.results.json").read_text(encoding="utf-8"))
        results[name]["hypotheses"] = (tmp_path / name / "validation.hyp.en").read_text(encoding="utf-8")
    ours, ct2 = results["transformers"], results["ctranslate2"]
    assert (
        ct2["hypotheses"] == ours["hypotheses"]
        and ct2["bleu"] == ours["bleu"]
        and ct2["chrf"] == ours["chrf"]
    )
    assert "backend" not in ours["decoding"] and ours["decoding"]["early_stopping"] == "never"
    assert ct2["decoding"]["backend"] == "ctranslate2" and ct2["decoding"]["early_stopping"] is None
    assert ct2["decoding"]["description"].startswith("CTranslate2 greedy (beam 1)")


def test_an_export_given_where_a_model_folder_is_needed_is_named_not_called_damaged(
    folder: Path, ct2_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A CTranslate2 or ONNX export given to a command that needs the transformers folder (or with
    ``--backend transformers``) is named for what it is, with the way to run it, in one line; the
    advice for a damaged save (resume from an earlier checkpoint, or delete the folder) is not given."""
    from hf_vanilla.cli.evaluate_bleu import main as evaluate
    from hf_vanilla.cli.translate import main as translate

    onnx = tmp_path / "onnx"  # what hf-vanilla-export-onnx writes beside its graphs
    onnx.mkdir()
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        (onnx / name).write_bytes((folder / name).read_bytes())
    (onnx / "encoder.onnx").write_bytes(b"graph")
    (tmp_path / "in.txt").write_text("w1\n")
    calls = [
        (translate, ct2_folder, ["--backend", "transformers"], "a CTranslate2 export (model.bin)"),
        (translate, onnx, [], "an ONNX export (*.onnx)"),
        (evaluate, onnx, [], "an ONNX export (*.onnx)"),
    ]
    for main, path, extra, kind in calls:
        arguments = ["--model_name_or_path", str(path), *extra]
        if main is translate:
            arguments += ["--input_file", str(tmp_path / "in.txt")]
        else:
            arguments += ["--validation_files", str(tmp_path / "in.txt"), str(tmp_path / "in.txt")]
            arguments += ["--output_dir", str(tmp_path / "eval")]
        assert main(arguments) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: {str(path)!r} is {kind}, not a transformers model folder"), err
        assert "To translate with the export itself" in err and "delete" not in err and "\n" not in err
    assert (onnx / "encoder.onnx").read_bytes() == b"graph"  # both exports untouched
    assert (ct2_folder / "model.bin").is_file()


def test_the_cli_applies_max_length_budgets_and_dtype(folder: Path, tmp_path: Path) -> None:
    from hf_vanilla.cli.translate import main

    (tmp_path / "in.txt").write_text("".join(line + "\n" for line in LINES))
    common = ["--model_name_or_path", str(folder), "--device", "cpu", "--num_beams", "1", "--input_file",
              str(tmp_path / "in.txt")]  # fmt: skip
    assert main([*common, "--output_file", str(tmp_path / "a.txt"), "--max_length", "3"]) == 0
    assert main([*common, "--output_file", str(tmp_path / "b.txt"), "--max_length", "3", "--max_tokens", "6",
                 "--batch_size", "2", "--buffer_size", "2", "--dtype", "float32"]) == 0  # fmt: skip
    model, tokenizer = _load(folder)
    expected = translate(model, tokenizer, LINES, GREEDY, generate_kwargs={"max_new_tokens": 3})
    for name in ("a.txt", "b.txt"):
        assert (tmp_path / name).read_text().splitlines() == expected
    assert max(len(line.split()) for line in expected) <= 3 and any(expected)


@pytest.mark.slow  # a real process importing the whole stack
def test_an_error_in_a_slow_stdin_stream_ends_in_one_line_and_status_1(folder: Path) -> None:
    """A real process reads a pipe that stays open: after a line is translated, an over-long line ends it
    with one ``error:`` line and status 1 while its stdin reader still waits for more."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).parents[2])}
    command = [sys.executable, "-m", "hf_vanilla.cli.translate", "--model_name_or_path", str(folder)]
    command += ["--num_beams", "1", "--device", "cpu"]
    with subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as process:
        process.stdin.write("w1 w2\n")
        process.stdin.flush()
        assert _readline(process.stdout, timeout=300) != ""  # the first line is translated: the stream runs
        process.stdin.write(
            " ".join(["w5"] * 64) + "\n"
        )  # 65 tokens with </s>: one more than the model takes
        process.stdin.flush()
        status = process.wait(timeout=120)  # stdin is still open
        stderr = process.stderr.read()
        process.stdin.close()
    assert status == 1, stderr
    assert "Fatal Python error" not in stderr
    assert stderr.splitlines()[-1].startswith("error: <stdin>, line 2: 65 tokens")


def test_greedy_decoding_passes_and_names_no_beam_options(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--num_beams 1`` is greedy search: generate() gets no length penalty or stopping rule (it warns
    about them), and the log line says greedy rather than describing a beam search."""
    model, tokenizer = _load(folder)
    passed: list[dict] = []
    generate = model.generate
    monkeypatch.setattr(model, "generate", lambda **kwargs: passed.append(kwargs) or generate(**kwargs))
    translate(model, tokenizer, ["w1 w2"], GREEDY)
    assert passed and not {"length_penalty", "early_stopping"} & passed[0].keys()
    assert passed[0]["num_beams"] == 1
    assert "greedy" in GREEDY.describe()
    assert "beam search" not in GREEDY.describe() and "early_stopping" not in GREEDY.describe()
    translate(model, tokenizer, ["w1 w2"], DecodingOptions())
    assert passed[-1]["length_penalty"] == 0.6 and passed[-1]["early_stopping"] == "never"


def _as_from_a_terminal() -> None:
    """In the child before it starts: SIGINT at its default, as for a command typed in a terminal. A
    test run started in the background (``cmd &``, some CI runners) passes SIGINT on ignored, and Python
    then rightly keeps ignoring Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow  # a real process importing the whole stack
def test_ctrl_c_ends_the_command_with_status_130_and_one_line(folder: Path) -> None:
    """SIGINT to ``hf-vanilla-translate`` waiting on stdin, once it has answered a first line (the
    readiness signal: the model is loaded and it reads on): status 130, ``interrupted`` as its one
    line, no traceback."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "hf_vanilla.cli.translate", "--model_name_or_path", str(folder)]
    process = subprocess.Popen(
        command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_as_from_a_terminal,
    )  # fmt: skip
    try:
        process.stdin.write("w4 w5\n")
        process.stdin.flush()
        assert _readline(process.stdout, timeout=300), "no translation"
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, err
    # Its one line ends stderr (before it: the loading's own warnings and progress bars).
    assert err.splitlines()[-1] == "interrupted" and err.count("interrupted") == 1, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]


# --------------------------------------------------------------------------------------------------
# One output line per input line
# --------------------------------------------------------------------------------------------------
#: Every line boundary ``str.splitlines()`` knows; a byte-level tokenizer can decode a token into any.
SEPARATORS = ("\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")


@pytest.fixture(scope="module")
def separator_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model folder whose tokenizer has a token ``a<separator>b`` for each of :data:`SEPARATORS`,
    and whose model is biased to emit them (``a\\nb`` most)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab |= {f"w{i}": i + 4 for i in range(96 - len(SEPARATORS))}
    vocab |= {f"a{separator}b": len(vocab) + k for k, separator in enumerate(SEPARATORS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    model = tiny_model(seed=0, final_logits_bias=True)
    with torch.no_grad():
        model.final_logits_bias[0, -len(SEPARATORS) :] = 8.0
        model.final_logits_bias[0, vocab["a\nb"]] = 9.0
    path = tmp_path_factory.mktemp("separators") / "model"
    save_model_folder(model, tokenizer, path)
    return path


SEPARATED_LINES = ["w1 w2", "", "w3", "w4 w5 w6", "w7 w8", "w9"]


@pytest.mark.parametrize("backend", ["transformers", "ctranslate2"])
def test_each_input_line_gives_one_output_line_whatever_the_tokens_decode_to(
    separator_folder: Path, tmp_path: Path, backend: str
) -> None:
    """Hypotheses that decode to text holding line separators still give one output line per input
    line (``--nbest N``: N lines), through the command, with either backend; the separators become spaces."""
    from hf_vanilla.cli.translate import main

    model = separator_folder
    if backend == "ctranslate2":
        pytest.importorskip("ctranslate2")
        from hf_vanilla.interop.export_ctranslate2 import export_ctranslate2

        model = Path(export_ctranslate2(separator_folder, tmp_path / "ct2"))
    (tmp_path / "in.txt").write_text("".join(line + "\n" for line in SEPARATED_LINES), encoding="utf-8")
    common = ["--model_name_or_path", str(model), "--device", "cpu", "--input_file", str(tmp_path / "in.txt"),
              "--max_length", "4", "--num_beams", "2"]  # fmt: skip
    assert main([*common, "--output_file", str(tmp_path / "out.txt")]) == 0
    assert main([*common, "--output_file", str(tmp_path / "out.nbest"), "--nbest", "2"]) == 0
    lines = (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(SEPARATED_LINES) and lines[1] == ""
    assert all("a b" in line for k, line in enumerate(lines) if k != 1), lines  # the tokens were emitted
    rows = [line.split("\t") for line in (tmp_path / "out.nbest").read_text(encoding="utf-8").splitlines()]
    assert [row[0] for row in rows] == ["0", "0", "1", "2", "2", "3", "3", "4", "4", "5", "5"]
    assert all(len(row) == 3 for row in rows)


def test_evaluate_writes_one_hypothesis_line_per_segment(separator_folder: Path, tmp_path: Path) -> None:
    from hf_vanilla.cli.evaluate_bleu import main as evaluate

    lines = [line for line in SEPARATED_LINES if line]
    for side in ("en", "de"):
        (tmp_path / f"val.{side}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    assert evaluate(["--model_name_or_path", str(separator_folder), "--validation_files", str(tmp_path / "val"),
                     "--source_lang", "en", "--target_lang", "de", "--device", "cpu", "--num_beams", "1",
                     "--output_dir", str(tmp_path / "eval")]) == 0  # fmt: skip
    hypotheses = (tmp_path / "eval" / "validation.hyp.de").read_text(encoding="utf-8").splitlines()
    results = json.loads((tmp_path / "eval" / "validation.results.json").read_text(encoding="utf-8"))
    assert len(hypotheses) == results["num_segments"] == len(lines)
    assert all("a b" in hypothesis for hypothesis in hypotheses), hypotheses


def test_one_line_turns_every_line_boundary_into_a_space() -> None:
    from hf_vanilla.inference.translation import one_line

    for separator in SEPARATORS:
        assert one_line(f" a{separator}b{separator}") == "a b"
