"""recipes/wmt14_en_de.sh: its plan (tokens per step whatever the number of processes) and a two-"node"
rehearsal on this CPU machine: two ``torchrun --nnodes 2 --nproc_per_node 1`` launches rendezvous on
localhost (c10d, an OS-chosen port, gloo with --use_cpu) and train the recipe at tiny size."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import free_port

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "wmt14_en_de.sh"
WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
GERMAN = ["eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun", "zehn"]
# A tiny model, no dropout (ranks would draw different masks), sentence-count batches so that 2 × 4 pairs
# and 1 × 8 pairs are the same global batch (token budgets split the data differently per process count).
TINY = ("--d_model 32 --layers 2 --attention_heads 4 --ffn_dim 64 --dropout 0 --max_tokens 0 --learning_rate 1e-3 "
        "--warmup_steps 1 --use_cpu --report_to none --seed 0 --ddp_timeout 60")  # fmt: skip


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **extra}


def _plan(**knobs: str) -> str:
    result = subprocess.run(["bash", str(RECIPE), "/nonexistent/out"], env=_env(DRY_RUN="1", **knobs),
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize(
    ("knobs", "max_tokens"),
    [
        ({"GPUS_PER_NODE": "8"}, 6250),  # the paper's 8 GPUs
        ({"GPUS_PER_NODE": "1", "GRAD_ACCUM": "8"}, 6250),
        ({"NNODES": "2", "GPUS_PER_NODE": "8", "GRAD_ACCUM": "2"}, 1562),
        ({"GPUS_PER_NODE": "4", "SIZE": "big"}, 12500),
    ],
)
def test_the_plan_keeps_50k_tokens_per_step_whatever_the_processes(
    knobs: dict[str, str], max_tokens: int
) -> None:
    out = _plan(**knobs)
    assert f"--max_tokens {max_tokens} " in out
    per_step = int(re.search(r"= (\d+) tokens per step", out).group(1))
    assert 50000 - 32 < per_step <= 50000  # rounded down to a whole number per process and micro-batch
    steps, save, last = ("300000", "600", "20") if knobs.get("SIZE") == "big" else ("100000", "1500", "5")
    assert f"--max_steps {steps} --save_steps {save}" in out and f"--last_n {last}" in out
    assert "--sacrebleu_test_set wmt14 --language_pair en-de --num_beams 4 --length_penalty 0.6" in out
    assert "--tokenized_bleu 13a" in out


def _data(folder: Path) -> Path:
    folder.mkdir()
    generator = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, 10, (int(torch.randint(2, 6, (1,), generator=generator)),), generator=generator)
            for _ in range(64)]  # fmt: skip
    (folder / "train.en").write_text("".join(" ".join(WORDS[i] for i in r) + "\n" for r in rows))
    (folder / "train.de").write_text("".join(" ".join(GERMAN[i] for i in r) + "\n" for r in rows))
    return folder / "train"


def _launch(
    out: Path, data: Path, nodes: int, rank: int, port: int, steps: int, extra: str
) -> subprocess.Popen:
    knobs = {"NNODES": str(nodes), "NODE_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
             "GPUS_PER_NODE": "1", "PRECISION": "no", "TRAIN_FILES": str(data), "VOCAB_SIZE": "300",
             "STAGES": "tokenizer train", "MAX_STEPS": str(steps), "TOKENIZER_WAIT": "120",
             "TRAIN_EXTRA": f"{TINY} {extra}"}  # fmt: skip
    return subprocess.Popen(["bash", str(RECIPE), str(out)], env=_env(**knobs), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip


def _finish(process: subprocess.Popen, timeout: float = 600) -> str:
    log = process.communicate(timeout=timeout)[0]
    assert process.returncode == 0, log[-4000:]
    return log


@pytest.mark.slow
def test_two_nodes_match_one_process_and_a_killed_node_resumes(tmp_path: Path) -> None:
    data = _data(tmp_path / "data")
    # 1. Two nodes × 1 process × 4 pairs vs one process × 8 pairs, 6 steps: the same weights.
    port = free_port()
    nodes = [_launch(tmp_path / "two", data, 2, r, port, 6, "--per_device_train_batch_size 4 --save_steps 3")
             for r in (0, 1)]  # fmt: skip
    for node in nodes:
        _finish(node)
    one = _launch(
        tmp_path / "one", data, 1, 0, free_port(), 6, "--per_device_train_batch_size 8 --save_steps 3"
    )
    _finish(one)
    two_w = load_file(tmp_path / "two" / "train" / "model.safetensors")
    one_w = load_file(tmp_path / "one" / "train" / "model.safetensors")
    assert two_w.keys() == one_w.keys()
    differences = {k: (two_w[k] - one_w[k]).abs().max().item() for k in one_w}
    assert max(differences.values()) < 1e-5, differences
    start = load_file(tmp_path / "one" / "train" / "checkpoint-3" / "model.safetensors")
    assert max((start[k] - one_w[k]).abs().max().item() for k in one_w) > 1e-3  # it did train

    # 2. Kill node 1 (its torchrun and worker) once a checkpoint exists: node 0 stops within the bound
    # with the recipe's one error line, and relaunching both nodes resumes from that checkpoint.
    out, port = tmp_path / "killed", free_port()
    extra = "--per_device_train_batch_size 4 --save_steps 5 --logging_steps 1"
    nodes = [_launch(out, data, 2, r, port, 100000, extra) for r in (0, 1)]
    deadline = time.monotonic() + 300
    while not (out / "train" / "checkpoint-5" / "trainer_state.json").is_file():
        assert time.monotonic() < deadline and nodes[0].poll() is None, nodes[0].communicate()[0][-4000:]
        time.sleep(0.2)
    os.killpg(nodes[1].pid, signal.SIGKILL)
    nodes[1].communicate()
    began = time.monotonic()
    log = nodes[0].communicate(timeout=240)[0]  # bounded: a hang fails here
    stopped_in = time.monotonic() - began
    assert nodes[0].returncode == 1, log[-4000:]
    errors = [line for line in log.splitlines() if line.startswith("error: training stopped")]
    assert len(errors) == 1 and "run the same command again on every node to resume" in errors[0], log[-4000:]
    checkpoints = sorted(int(p.name.split("-")[1]) for p in (out / "train").glob("checkpoint-*"))
    assert checkpoints, log[-4000:]
    resumed_at, port = checkpoints[-1], free_port()
    nodes = [_launch(out, data, 2, r, port, resumed_at + 5, extra) for r in (0, 1)]
    logs = [_finish(node) for node in nodes]
    assert f"checkpoint-{resumed_at}" in logs[0] and "--resume_from_checkpoint last" in logs[0]
    assert (out / "train" / f"checkpoint-{resumed_at + 5}" / "trainer_state.json").is_file()
    assert stopped_in < 240
