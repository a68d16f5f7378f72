"""Data parallelism on CPU (gloo) through the project's training script, Accelerate configs, big-model loading.

The multi-process tests launch ``scripts/train.py`` unchanged (through tests/train_driver.py, which only
records what each process saw) with ``torchrun --nproc_per_node 2`` and ``accelerate launch --multi_gpu
--num_processes 2`` — which on a machine without GPUs runs two CPU processes over gloo — and compare
with one process that sees the same global batches. ``accelerate launch --cpu --num_processes 2`` runs
one process only (accelerate 1.15); a slow test pins that down, so every test here proves that two
ranks ran. Every launch is in the slow tier; the default tier checks the launch checks in process
(``test_check_process_group``, ``test_check_fsdp_honoured``).
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from accelerate.utils import DistributedType
from helpers import (
    CARD_ARGS,
    CONFIGS,
    ROOT,
    TRAIN,
    VALID,
    Run,
    check_matches_one_process,
    gloo_threads,
    tiny_model,
    train_args,
)
from transformers import AutoModelForSeq2SeqLM

from hf_vanilla import VanillaTransformerForConditionalGeneration
from hf_vanilla.data.numbers import make_demo_splits
from hf_vanilla.io.checkpoints import verify_checkpoint
from hf_vanilla.io.pickles import PICKLE_SUFFIXES
from hf_vanilla.io.safe_loading import verify_model_folder
from hf_vanilla.training.launch_checks import (
    LaunchError,
    check_fsdp_honoured,
    check_process_group,
    end_process_group,
)


def _launch_pair(
    tmp: Path, tokenizer_dir: Path | None, launcher: str, two: list[str], one: list[str]
) -> tuple[Run, Run]:
    """Start the 2-process run and its 1-process reference side by side; wait for both."""
    double = Run(tmp / launcher, launcher, train_args(tokenizer_dir, tmp / launcher / "out", *two))
    single = Run(tmp / "single", "python", train_args(tokenizer_dir, tmp / "single" / "out", *one))
    return double.wait(), single.wait()


@pytest.fixture(scope="module")
def sentence_batches(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Run]:
    """torchrun, 2 processes × 4 pairs, against 1 process × 8 pairs (``--max_tokens 0``: sentence-count
    batches instead of the default token budget): the same global batches
    (Accelerate deals consecutive batches of the same seeded permutation to the ranks). No tokenizer
    is given: each run trains its own."""
    return _launch_pair(
        tmp_path_factory.mktemp("ddp"),
        None,
        "torchrun",
        ["--max_tokens", "0", "--per_device_train_batch_size", "4", "--log_level_replica", "info"],
        ["--max_tokens", "0", "--per_device_train_batch_size", "8"],
    )


def _check_two_ranks(run: Run) -> None:
    ranks = run.ranks()
    assert [r["rank"] for r in ranks] == [0, 1] and {r["world_size"] for r in ranks} == {2}
    assert ranks[0]["pid"] != ranks[1]["pid"]
    assert ranks[0]["tokenizer_sha256"] == ranks[1]["tokenizer_sha256"]


def _check_identical_ranks(run: Run) -> None:
    first, second = run.params(0), run.params(1)
    assert first.keys() == second.keys()
    for key in first:
        assert torch.equal(first[key], second[key]), key


@pytest.mark.slow
def test_two_processes_really_ran(sentence_batches: tuple[Run, Run]) -> None:
    _check_two_ranks(sentence_batches[0])


@pytest.mark.slow
def test_each_process_ends_its_process_group_before_it_exits(sentence_batches: tuple[Run, Run]) -> None:
    """A gloo group left alive can abort the exit of a run that saved everything (exit -6)."""
    assert sentence_batches[0].exits() == [{"process_group_alive": False, "gloo_threads": 0}] * 2
    assert sentence_batches[1].exits() == [{"process_group_alive": False, "gloo_threads": 0}]


@pytest.mark.slow
def test_the_tokenizer_is_trained_once_and_shared_with_the_other_rank(
    sentence_batches: tuple[Run, Run],
) -> None:
    double, single = sentence_batches  # both log at info level on every rank (--log_level_replica info)
    assert double.log.count("Training a shared BPE tokenizer") == 1, double.log[-4000:]
    assert double.log.count("Loaded the tokenizer the main process trained") == 2, double.log[-4000:]
    assert {r["tokenizer_sha256"] for r in double.ranks()} == {single.ranks()[0]["tokenizer_sha256"]}


@pytest.mark.slow
def test_parameters_are_identical_on_both_ranks(sentence_batches: tuple[Run, Run]) -> None:
    _check_identical_ranks(sentence_batches[0])


@pytest.mark.slow
def test_two_processes_match_one_process_with_the_same_global_batch(
    sentence_batches: tuple[Run, Run],
) -> None:
    check_matches_one_process(*sentence_batches)


@pytest.mark.slow
def test_a_time_budget_stops_both_ranks_after_the_same_step_with_the_same_rates(tmp_path: Path) -> None:
    """``--max_train_minutes`` under torchrun: the ranks use the largest of their clocks, so they stop
    after the same step and save it together, and apply the same cooled-down rates (identical weights)."""
    args = ["--max_tokens", "0", "--per_device_train_batch_size", "4", "--max_steps", "100000"]
    args += ["--max_train_minutes", "0.1", "--lr_cooldown_fraction", "0.5", "--do_eval", "false"]
    args += ["--save_strategy", "steps", "--save_steps", "100000"]
    run = Run(
        tmp_path / "torchrun", "torchrun", train_args(None, tmp_path / "torchrun" / "out", *args)
    ).wait()
    _check_two_ranks(run)
    _check_identical_ranks(run)
    [stop] = [line for line in run.log.splitlines() if "stopping after step" in line]
    step = int(stop.split("stopping after step ")[1].split(",")[0])
    assert 4 < step < 100_000
    assert [p.name for p in run.out.glob("checkpoint-*")] == [f"checkpoint-{step}"]


@pytest.mark.slow
def test_generation_evaluation_sees_every_sentence_once(sentence_batches: tuple[Run, Run]) -> None:
    """BLEU over 2 processes scores each validation sentence exactly once, in order, like 1 process."""
    double, single = sentence_batches
    expected = [pair["de"] for pair in make_demo_splits(TRAIN, VALID, 0)["validation"]["translation"]]
    reference = single.evaluation()
    assert reference["references"] == expected
    for rank in (0, 1):  # compute_metrics runs on every rank, on the gathered predictions
        evaluation = double.evaluation(rank)
        assert evaluation["references"] == expected  # 7, none twice, none missing
        assert evaluation["hypotheses"] == reference["hypotheses"]
        assert evaluation["metrics"] == pytest.approx(reference["metrics"])
    # The unsmoothed NLL counts each sentence once (7 sentences in batches of 2 on 2 processes:
    # Accelerate repeats one to fill the last batch).
    results = [json.loads((run.out / "eval_results.json").read_text()) for run in (double, single)]
    assert results[0]["eval_nll_loss"] == pytest.approx(results[1]["eval_nll_loss"], rel=1e-5)
    assert results[0]["eval_ppl"] == pytest.approx(math.exp(results[0]["eval_nll_loss"]), rel=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["accelerate", "accelerate-flag"])
def test_accelerate_launch_runs_two_cpu_processes(
    tmp_path: Path, tokenizer_dir: Path, sentence_batches: tuple[Run, Run], launcher: str
) -> None:
    """``accelerate launch --config_file configs/accelerate/ddp.yaml`` and ``--multi_gpu``, on CPU."""
    run = Run(
        tmp_path,
        launcher,
        train_args(
            tokenizer_dir,
            tmp_path / "out",
            *("--max_tokens", "0", "--per_device_train_batch_size", "4", "--do_eval", "false"),
        ),
    ).wait()
    _check_two_ranks(run)
    _check_identical_ranks(run)
    check_matches_one_process(run, sentence_batches[1])


@pytest.mark.slow
def test_accelerate_launch_cpu_flag_with_two_processes_is_refused(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    """``--cpu --num_processes 2`` starts one process (accelerate 1.15); the script refuses it."""
    run = Run(tmp_path, "accelerate-cpu", train_args(tokenizer_dir, tmp_path / "out", "--max_steps", "1"))
    run.refused("started only this one")
    # One error of ours: accelerate ≥ 1.16 repeats the child's stderr in its own CalledProcessError, so the
    # same line may appear twice in the log, but never a second message.
    errors = {line for line in run.log.splitlines() if line.startswith("error: ")}
    assert len(errors) == 1, errors


@pytest.mark.slow
def test_launch_without_use_cpu_on_a_cpu_machine_is_refused(tmp_path: Path, tokenizer_dir: Path) -> None:
    """``torchrun --nproc_per_node 2`` without ``--use_cpu`` on a machine without GPUs: both processes
    find no GPU and join no process group; instead of two unconnected runs into one --output_dir,
    each refuses before writing anything."""
    args = [a for a in train_args(tokenizer_dir, tmp_path / "out") if a != "--use_cpu"]
    if torch.cuda.is_available():
        pytest.skip("on a GPU machine the processes do form a process group")
    Run(tmp_path, "torchrun", args).refused("joined no process group")


@pytest.mark.parametrize(
    "launcher, extra",
    [
        pytest.param(
            "accelerate-fsdp", [], marks=pytest.mark.slow
        ),  # configs/accelerate/fsdp.yaml, with --use_cpu
        pytest.param(
            "torchrun",
            ["--fsdp", "full_shard auto_wrap", "--fsdp_config", json.dumps({"version": 2})],
            marks=pytest.mark.slow,
        ),  # the Trainer's own FSDP arguments
    ],
)
def test_fsdp_on_cpu_is_refused_not_replaced_by_ddp(
    tmp_path: Path, tokenizer_dir: Path, launcher: str, extra: list[str]
) -> None:
    """accelerate 1.15 applies FSDP only on GPUs: on CPU it would train plain DDP without a word."""
    if torch.cuda.is_available():
        pytest.skip("FSDP is honoured on GPUs")
    Run(tmp_path, launcher, train_args(tokenizer_dir, tmp_path / "out", *extra)).refused("FSDP was asked for")


@pytest.mark.slow
def test_token_budget_batches_two_processes_match_one_process_with_accumulation(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    """§5.1 token-budget batches: 2 processes × 1 batch per step equal 1 process × 2 accumulated batches
    (the sampler deals the same global batch list to the ranks round-robin)."""
    budget = ["--max_tokens", "200", "--do_eval", "false"]
    double, single = _launch_pair(
        tmp_path, tokenizer_dir, "torchrun", budget, [*budget, "--gradient_accumulation_steps", "2"]
    )
    _check_two_ranks(double)
    _check_identical_ranks(double)
    check_matches_one_process(double, single)


@pytest.mark.slow
def test_checkpoints_every_step_hold_each_ranks_rng_state_and_resume_to_the_same_weights(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    """torchrun, 2 processes, dropout on (each rank draws its own masks), a checkpoint after every step:
    each checkpoint holds ``rng_state_0.pth`` and ``rng_state_1.pth`` beside the model, and passes
    ``verify_checkpoint``; the final model folder and the average of the last two checkpoints (§6.1)
    hold no pickle. A run resumed from a copy of the
    step-2 checkpoint ends with the weights of the run that never stopped, bit for bit, which it can
    only if each rank got its own dropout RNG back."""
    extra = [
        "--max_tokens", "0", "--per_device_train_batch_size", "4", "--do_eval", "false", "--dropout", "0.1",
        "--save_strategy", "steps", "--save_steps", "1",
    ]  # fmt: skip
    straight = Run(
        tmp_path / "straight", "torchrun",
        train_args(tokenizer_dir, tmp_path / "straight" / "out", *extra, "--average_last_n_checkpoints", "2"),
    ).wait()  # fmt: skip
    _check_two_ranks(straight)
    for step in (1, 2, 3, 4):
        checkpoint = straight.out / f"checkpoint-{step}"
        verify_checkpoint(checkpoint)  # the RNG states are plain tensor data, listed in the checksums
        names = {p.name for p in checkpoint.iterdir()}
        assert {"model.safetensors", "optimizer.pt", "rng_state_0.pth", "rng_state_1.pth"} <= names
        assert "rng_state.pth" not in names
    for folder in (straight.out, straight.out / "averaged"):
        assert [p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES] == []
        verify_model_folder(folder)

    (tmp_path / "resumed" / "out").mkdir(parents=True)
    shutil.copytree(straight.out / "checkpoint-2", tmp_path / "resumed" / "out" / "checkpoint-2")
    resumed = Run(
        tmp_path / "resumed", "torchrun",
        train_args(tokenizer_dir, tmp_path / "resumed" / "out", *extra, "--resume_from_checkpoint", "last"),
    ).wait()  # fmt: skip
    assert sorted(p.name for p in resumed.out.glob("checkpoint-*")) == [f"checkpoint-{s}" for s in (2, 3, 4)]
    assert [p.name for p in resumed.out.iterdir() if p.suffix in PICKLE_SUFFIXES] == []
    for rank in (0, 1):
        final, again = straight.params(rank), resumed.params(rank)
        assert again.keys() == final.keys()
        for name, value in final.items():
            assert torch.equal(again[name], value), (rank, name)


@pytest.mark.slow
def test_training_push_under_ddp_writes_one_hub_folder_and_fails_offline_in_one_line(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    """torchrun, 2 processes, ``--push_to_hub`` offline: only the main process scores, writes
    ``OUTPUT_DIR/hub`` and tries the push; the run ends in exactly one ``error:`` line naming the retry
    command, with the trained model, the results and the Hub folder kept."""
    extra = ["--max_tokens", "0", "--per_device_train_batch_size", "4", "--do_eval", "false"]
    run = Run(
        tmp_path, "torchrun",
        train_args(tokenizer_dir, tmp_path / "out", *extra, "--push_to_hub", "--hub_model_id", "someone/x", *CARD_ARGS),
    )  # fmt: skip
    run.finish()
    assert run.process.returncode != 0
    errors = [line for line in run.log.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "offline mode is on" in errors[0], run.log[-4000:]
    assert f"hf-vanilla-publish --push_only --output_dir {run.out / 'hub'}" in errors[0]
    assert (run.out / "model.safetensors").is_file() and (run.out / "validation.results.json").is_file()
    assert {"README.md", "model.safetensors", "modeling_vanilla_transformer.py"} <= {
        p.name for p in (run.out / "hub").iterdir()
    }
    assert [p.name for p in run.out.iterdir() if p.name.startswith(".")] == []  # no staged folder left


# --------------------------------------------------------------------------------------------------
# Accelerate config files
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["ddp.yaml", "fsdp.yaml", "deepspeed_zero2.yaml"])
def test_accelerate_configs_parse(name: str) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(CONFIGS / name))
    assert config.compute_environment.value == "LOCAL_MACHINE"
    assert config.num_machines == 1 and config.machine_rank == 0
    assert config.mixed_precision == "bf16"


def test_fsdp_config_wraps_the_layers_the_model_never_splits() -> None:
    config = yaml.safe_load((CONFIGS / "fsdp.yaml").read_text())
    fsdp = config["fsdp_config"]
    wrapped = fsdp["fsdp_transformer_layer_cls_to_wrap"].split(",")
    assert sorted(wrapped) == sorted(VanillaTransformerForConditionalGeneration._no_split_modules)
    model = tiny_model()
    layer_classes = {type(m).__name__ for m in model.modules()}
    assert set(wrapped) <= layer_classes
    # A full state dict is gathered on rank 0 and saved as model.safetensors: averaging (§6.1) reads it,
    # and nothing pickled (a sharded checkpoint's DCP .metadata) is needed to resume.
    assert fsdp["fsdp_state_dict_type"] == "FULL_STATE_DICT"


def test_deepspeed_config_is_zero_stage_2() -> None:
    config = yaml.safe_load((CONFIGS / "deepspeed_zero2.yaml").read_text())
    assert config["distributed_type"] == "DEEPSPEED"
    settings = json.loads((ROOT / config["deepspeed_config"]["deepspeed_config_file"]).read_text())
    assert settings["zero_optimization"]["stage"] == 2
    # Left to the Trainer, which fills them from the command line (a fixed value that disagrees is an error).
    for key in ("gradient_accumulation_steps", "gradient_clipping", "train_micro_batch_size_per_gpu"):
        assert settings[key] == "auto"
    assert (
        settings["bf16"]["enabled"] == "auto" and "optimizer" not in settings and "scheduler" not in settings
    )


# --------------------------------------------------------------------------------------------------
# Big-model inference
# --------------------------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:.*offload")
@pytest.mark.parametrize("budget", ["half", "none"])
def test_device_map_auto_with_a_memory_limit_generates_the_same_tokens(tmp_path: Path, budget: str) -> None:
    model = tiny_model()
    model.save_pretrained(tmp_path / "model")
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    max_memory = {"cpu": size // 2 if budget == "half" else 1}
    input_ids = torch.tensor([[5, 6, 7, 8, 9, 10, 2], [11, 12, 2, 0, 0, 0, 0]])
    inputs = {"input_ids": input_ids, "attention_mask": (input_ids != 0).long()}
    expected = model.generate(**inputs, max_new_tokens=12)

    placed = AutoModelForSeq2SeqLM.from_pretrained(
        tmp_path / "model", device_map="auto", max_memory=max_memory, offload_folder=tmp_path / "offload"
    )
    devices = set(placed.hf_device_map.values())
    assert "disk" in devices and (devices == {"cpu", "disk"} if budget == "half" else devices == {"disk"})
    # Placement respects _no_split_modules: a layer is never spread over two devices.
    for key in placed.hf_device_map:
        parts = key.split(".")
        if "layers" in parts:
            assert len(parts) <= parts.index("layers") + 2, key
    torch.testing.assert_close(placed.generate(**inputs, max_new_tokens=12), expected, rtol=0, atol=0)


# --------------------------------------------------------------------------------------------------
# Launch checks, one process (the launches above prove them end to end)
# --------------------------------------------------------------------------------------------------
_LAUNCH_VARIABLES = ("WORLD_SIZE", "RANK", "ACCELERATE_USE_CPU", "MASTER_ADDR", "ACCELERATE_USE_FSDP")


@pytest.fixture
def clean_launch_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in _LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    "env, world_size, refused",
    [
        ({}, 1, False),  # python scripts/train.py
        ({"WORLD_SIZE": "2", "RANK": "1"}, 2, False),  # torchrun --use_cpu: one process group of 2
        ({"WORLD_SIZE": "1", "RANK": "0"}, 1, False),  # torchrun --nproc_per_node 1
        ({"WORLD_SIZE": "2", "RANK": "1"}, 1, True),  # torchrun without --use_cpu on CPU
        ({"ACCELERATE_USE_CPU": "True"}, 1, False),  # accelerate launch --cpu, 1 process
        ({"ACCELERATE_USE_CPU": "True", "MASTER_ADDR": "127.0.0.1"}, 1, True),  # --cpu --num_processes 2
    ],
)
def test_check_process_group(
    clean_launch_env: pytest.MonkeyPatch, env: dict[str, str], world_size: int, refused: bool
) -> None:
    for name, value in env.items():
        clean_launch_env.setenv(name, value)
    args = SimpleNamespace(world_size=world_size)
    if refused:
        with pytest.raises(LaunchError, match="Nothing was written"):
            check_process_group(args)
    else:
        check_process_group(args)


@pytest.mark.parametrize(
    "fsdp, env, distributed_type, refused",
    [
        (None, {}, "MULTI_CPU", False),  # DDP asked, DDP given
        (None, {"ACCELERATE_USE_FSDP": "true"}, "MULTI_CPU", True),  # fsdp.yaml on CPU
        (True, {}, "MULTI_CPU", True),  # --fsdp on CPU
        (True, {}, "NO", True),  # --fsdp, one process
        (None, {"ACCELERATE_USE_FSDP": "true"}, "FSDP", False),  # sharded (GPUs, or the test shim)
    ],
)
def test_check_fsdp_honoured(
    clean_launch_env: pytest.MonkeyPatch,
    fsdp: bool | None,
    env: dict[str, str],
    distributed_type: str,
    refused: bool,
) -> None:
    for name, value in env.items():
        clean_launch_env.setenv(name, value)
    accelerator = SimpleNamespace(distributed_type=DistributedType[distributed_type], num_processes=2)
    args = SimpleNamespace(fsdp=fsdp)
    if refused:
        with pytest.raises(LaunchError, match="FSDP was asked for"):
            check_fsdp_honoured(accelerator, args)
    else:
        check_fsdp_honoured(accelerator, args)


def test_end_process_group_ends_the_group_and_its_threads_and_needs_none(gloo_group_of_one: None) -> None:
    started = time.monotonic()  # gloo's thread names itself once it runs: on a loaded machine, a moment later
    while gloo_threads() == 0 and time.monotonic() - started < 10:
        time.sleep(0.01)
    assert gloo_threads() > 0
    end_process_group()
    assert not torch.distributed.is_initialized()
    assert gloo_threads() == 0  # really gone: the Python ProcessGroup was its last owner
    end_process_group()  # a process without a group (python scripts/train.py): nothing to do


def test_end_process_group_refuses_while_a_ddp_model_lives_and_keeps_the_group(
    gloo_group_of_one: None,
) -> None:
    """Destroyed under a live DistributedDataParallel, the group would be freed later by the wrapper's
    reducer with the GIL held: the hang CI saw in the 2-process Trainer test (see end_process_group)."""
    wrapped = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    cycle = {"wrapped": wrapped}
    cycle["self"] = cycle  # as a Trainer's reference cycles keep its wrapper after the last name goes
    with pytest.raises(RuntimeError, match=r"Drop the Trainer and the wrapped model first \(del trainer\)"):
        end_process_group()
    assert torch.distributed.is_initialized()  # nothing done
    del wrapped, cycle  # garbage, found by end_process_group's collection
    end_process_group()
    assert not torch.distributed.is_initialized()
    assert gloo_threads() == 0
