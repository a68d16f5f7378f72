"""A corpus translated on several processes: ``--num_shards/--shard_id`` then ``--merge`` (in process), and
``torchrun`` / ``accelerate launch`` with 2 CPU processes (slow tier) give the one-process output; a killed
launch relaunched finishes with it; missing, unfinished or mismatched parts are refused in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import CONFIGS, ROOT, Outputs, kill_processes_mentioning, varied_model_folder

from hf_vanilla.cli.translate import main
from hf_vanilla.inference.sharding import parts_folder

#: 13 lines: blank ones, a mid-file line that starts with U+FEFF (kept in one process: so in a part too).
LINES = [f"w{i % 90 + 4} w{(7 * i) % 90 + 4}" + (" w9" * (i % 4)) for i in range(13)]
LINES[3] = LINES[9] = ""
LINES[4] = "\ufeffw5 w6"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return varied_model_folder(tmp_path_factory.mktemp("sharding") / "model")


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.en"
    path.write_text("\ufeff" + "\n".join(LINES) + "\n", encoding="utf-8")
    return path


def _args(folder: Path, source: Path, output: Path, *extra: str) -> list[str]:
    return [
        "--model_name_or_path", str(folder), "--device", "cpu", "--input_file", str(source),
        "--output_file", str(output), "--max_length", "6", *extra,
    ]  # fmt: skip


def _run(args: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    status = main(args)
    return status, capsys.readouterr().err


def _refused(args: list[str], capsys: pytest.CaptureFixture, fragment: str) -> str:
    status, err = _run(args, capsys)
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert status == 1 and len(errors) == 1 and fragment in errors[0], err
    assert "Traceback" not in err
    return errors[0]


def _shards(args: list[str], capsys: pytest.CaptureFixture, shards: int, which: range | None = None) -> None:
    for shard in which if which is not None else range(shards):
        status, err = _run([*args, "--num_shards", str(shards), "--shard_id", str(shard)], capsys)
        assert status == 0, err


@pytest.mark.parametrize(
    "decoding",
    [("--num_beams", "1"), ("--num_beams", "2", "--nbest", "2")],
    ids=["greedy-with-alignments", "beam-nbest"],
)
def test_shards_then_merge_give_the_one_process_output(
    folder: Path, source: Path, tmp_path: Path, capsys: pytest.CaptureFixture, decoding: tuple[str, ...]
) -> None:
    """3 shards of parts of at most 2 lines, merged: the same bytes as one process (n-best indices count
    from the corpus's first line, alignments follow their lines), and no parts folder is left."""
    alignments = "--nbest" not in decoding

    def outputs(name: str) -> list[str]:
        return [*decoding, *(["--alignment_file", str(tmp_path / f"{name}.align")] if alignments else [])]

    assert _run(_args(folder, source, tmp_path / "one.de", *outputs("one")), capsys)[0] == 0
    args = _args(folder, source, tmp_path / "three.de", "--buffer_size", "2", *outputs("three"))
    _shards(args, capsys, 3)
    assert not (tmp_path / "three.de").exists()  # only --merge writes the output
    assert len(list(parts_folder(tmp_path / "three.de").glob("part-*.done"))) == 7
    assert _run([*args, "--num_shards", "3", "--merge"], capsys)[0] == 0
    assert (tmp_path / "three.de").read_bytes() == (tmp_path / "one.de").read_bytes()
    if alignments:
        assert (tmp_path / "three.align").read_bytes() == (tmp_path / "one.align").read_bytes()
    one = (tmp_path / "one.de").read_text(encoding="utf-8").splitlines()
    assert len({line for line in one if line}) > 3  # the lines differ: a misplaced part would show
    assert not parts_folder(tmp_path / "three.de").exists()


def test_a_relaunched_shard_redoes_only_its_unfinished_parts(
    folder: Path, source: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A shard killed in its third part (that part without its done marker, a temporary file beside it) and
    run again rewrites only that part; the merge then gives the one-process output."""
    assert _run(_args(folder, source, tmp_path / "one.de", "--num_beams", "1"), capsys)[0] == 0
    output = tmp_path / "two.de"
    args = _args(folder, source, output, "--num_beams", "1", "--buffer_size", "2")
    _shards(args, capsys, 2, range(1))
    parts = parts_folder(output)
    (parts / "part-000002.done").unlink()
    (parts / ".part-000002.txt.tmp-12345678").write_text("half a part")
    before = {path.name: path.stat().st_mtime_ns for path in parts.glob("part-*")}
    _shards(args, capsys, 2, range(1))
    after = {path.name: path.stat().st_mtime_ns for path in parts.glob("part-*")}
    assert {name for name in after if after[name] != before.get(name)} == {
        "part-000002.txt",
        "part-000002.done",
    }
    _shards(args, capsys, 2, range(1, 2))
    assert _run([*args, "--merge"], capsys)[0] == 0
    assert output.read_bytes() == (tmp_path / "one.de").read_bytes()


def test_merge_refuses_missing_unfinished_or_mismatched_parts(
    folder: Path, source: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """--merge writes nothing, in one line, while a shard's parts are missing, a part was changed after its
    marker, or the input or the options differ from the parts'; an existing output stays without
    --overwrite. A damaged plan is refused naming it."""
    output = tmp_path / "two.de"
    args = _args(folder, source, output, "--num_beams", "1", "--buffer_size", "3")
    merge = [*args, "--num_shards", "2", "--merge"]
    _refused(merge, capsys, "holds no parts")
    parts_folder(output).mkdir()
    (parts_folder(output) / "plan.json").write_text('{"lines": 13}')
    _refused(
        [*args, "--num_shards", "2", "--shard_id", "0"], capsys, "plan.json' is damaged: 'part_lines' is None"
    )
    (parts_folder(output) / "plan.json").unlink()
    _shards(args, capsys, 2, range(1))
    assert _refused(merge, capsys, "3 of the 5 parts").endswith("Run shard(s) 1 again (--shard_id).")
    _shards(args, capsys, 2, range(1, 2))
    part = parts_folder(output) / "part-000001.txt"
    kept = part.read_bytes()
    part.write_bytes(kept[:-2] + b"\n")  # a part damaged after it was finished
    assert "(part 2)" in _refused(merge, capsys, "missing or unfinished")
    part.write_bytes(kept)
    _refused([*merge, "--num_beams", "2"], capsys, "other options (num_beams 1 → 2)")
    source.write_text(source.read_text(encoding="utf-8") + "w5\n", encoding="utf-8")
    _refused(merge, capsys, "another input (13 lines, now 14")
    source.write_text(source.read_text(encoding="utf-8")[: -len("w5\n")], encoding="utf-8")
    output.write_text("the user's file\n")
    _refused(merge, capsys, "already exists")
    assert output.read_text() == "the user's file\n"
    assert not [path for path in tmp_path.iterdir() if path.name.startswith(".two.de")]
    assert _run([*merge, "--overwrite"], capsys)[0] == 0
    assert len(output.read_text(encoding="utf-8").splitlines()) == len(LINES)


@pytest.mark.parametrize(
    ("extra", "environment", "fragment"),
    [
        (["--shard_id", "0"], {}, "give --num_shards too"),
        (["--num_shards", "2", "--shard_id", "2"], {}, "give a shard from 0 to 1"),
        (["--num_shards", "0", "--shard_id", "0"], {}, "--num_shards 0: give a positive number"),
        (["--num_shards", "2"], {}, "give --shard_id (0 to 1)"),
        (["--num_shards", "2", "--merge", "--shard_id", "1"], {}, "leave out --shard_id"),
        (["--num_shards", "2", "--shard_id", "0", "--output_file", "-"], {}, "needs --input_file FILE"),
        (
            ["--num_shards", "2", "--shard_id", "0"],
            {"WORLD_SIZE": "2", "RANK": "1"},
            "leave out --num_shards",
        ),
        ([], {"WORLD_SIZE": "2", "RANK": "x"}, "not the numbers a launcher sets"),
    ],
)
def test_contradictory_split_flags_are_refused_before_anything_is_done(
    folder: Path,
    source: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    extra: list[str],
    environment: dict[str, str],
    fragment: str,
) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    _refused([*_args(folder, source, tmp_path / "out.de"), *extra], capsys, fragment)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["corpus.en"]


def _launch(launcher: str, args: list[str], root: Path, **env: str) -> subprocess.Popen:
    launchers = {
        "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"],
        "accelerate": [
            sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / "ddp.yaml"),
            "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", "0",
        ],
    }  # fmt: skip
    environment = {
        **os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **env,
    }  # fmt: skip
    command = [*launchers[launcher], str(ROOT / "tests" / "translate_driver.py"), *args]
    return subprocess.Popen(
        command, cwd=root, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _finished(process: subprocess.Popen, root: Path) -> str:
    try:
        log = process.communicate(timeout=600)[0]
    except subprocess.TimeoutExpired:
        kill_processes_mentioning(root)
        raise
    assert process.returncode == 0, log[-4000:]
    return log


@pytest.mark.slow
@pytest.mark.parametrize(
    ("launcher", "decoding"),
    [("torchrun", ("--num_beams", "1")), ("accelerate", ("--num_beams", "4", "--nbest", "4"))],
    ids=["torchrun-greedy", "accelerate-beam4-nbest"],
)
def test_two_launched_processes_give_the_one_process_output(
    folder: Path,
    source: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    launcher: str,
    decoding: tuple[str, ...],
) -> None:
    """Greedy fp32: byte for byte. Beam 4: the same hypotheses in the same order (scores to the 4 decimals
    written, up to 1e-4 for sums in another batch)."""
    assert _run(_args(folder, source, tmp_path / "one.de", *decoding), capsys)[0] == 0
    log = _finished(
        _launch(launcher, _args(folder, source, tmp_path / "two.de", *decoding), tmp_path), tmp_path
    )
    assert "Shard 0 of 2" in log and "Shard 1 of 2" in log
    one = (tmp_path / "one.de").read_text(encoding="utf-8").splitlines()
    two = (tmp_path / "two.de").read_text(encoding="utf-8").splitlines()
    if "--nbest" not in decoding:
        assert (tmp_path / "two.de").read_bytes() == (tmp_path / "one.de").read_bytes()
    else:
        assert [line.split("\t")[::2] for line in two] == [line.split("\t")[::2] for line in one]
        for ours, theirs in zip(two, one, strict=True):
            if ours.split("\t")[1]:
                assert abs(float(ours.split("\t")[1]) - float(theirs.split("\t")[1])) <= 1e-4
    assert len(one) == sum(4 if line and "--nbest" in decoding else 1 for line in LINES)
    assert not parts_folder(tmp_path / "two.de").exists()


@pytest.mark.slow
def test_a_launch_with_a_rank_killed_relaunched_finishes_with_the_same_file(
    folder: Path, source: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """torchrun, 2 processes, parts of 2 lines: rank 1 is SIGKILLed in its second part (torchrun then stops
    rank 0); the same command again skips the parts that were finished and writes the one-process file."""
    assert _run(_args(folder, source, tmp_path / "one.de", "--num_beams", "1"), capsys)[0] == 0
    args = _args(folder, source, tmp_path / "two.de", "--num_beams", "1", "--buffer_size", "2")
    launch = _launch("torchrun", args, tmp_path, HF_VANILLA_STOP_RANK="1")
    outputs = Outputs(launch)
    try:
        pid = int(outputs.wait_for(r"rank 1 stopped, pid (\d+)", timeout=300).group(1))
        os.kill(pid, signal.SIGKILL)
        launch.wait(timeout=120)
    finally:
        kill_processes_mentioning(tmp_path)
    assert launch.returncode != 0
    assert not (tmp_path / "two.de").exists()
    assert (parts_folder(tmp_path / "two.de") / "part-000003.done").is_file()  # rank 1's first part
    log = _finished(_launch("torchrun", args, tmp_path), tmp_path)
    assert "Shard 1 of 2: parts 4 to 7 of 7 (1 finished before, skipped)" in log
    assert (tmp_path / "two.de").read_bytes() == (tmp_path / "one.de").read_bytes()
