"""Token-budget batching (hf_vanilla/data/batching.py): budget, epochs, data-parallel sharding, Trainer runs.

Also a worker script: `torchrun --nproc_per_node 2 tests/data/test_batching.py OUT_DIR` (used by the slow test).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from accelerate.data_loader import prepare_data_loader, skip_first_batches
from helpers import gloo_threads
from torch.utils.data import DataLoader
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainingArguments

from hf_vanilla.data.batching import (
    TokenBudgetBatchSampler,
    padded_tokens,
    padding_efficiency,
    padding_report,
    sequence_lengths,
)
from hf_vanilla.training.launch_checks import end_process_group
from hf_vanilla.training.trainer import PaperSeq2SeqTrainer, unshard_prepared_dataloader


def random_lengths(n: int = 500, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    source = rng.integers(1, 60, n)
    target = np.clip(source + rng.integers(-5, 6, n), 1, None)
    return source, target


def epoch_batches(sampler: TokenBudgetBatchSampler, epoch: int) -> list[list[int]]:
    sampler.set_epoch(epoch)
    return list(sampler)


# ---------------------------------------------------------------- the budget


@pytest.mark.parametrize("sort_pool_size", [None, 64])
def test_batches_fit_the_budget_and_cover_each_example_once(sort_pool_size: int | None) -> None:
    source, target = random_lengths()
    sampler = TokenBudgetBatchSampler(source, target, max_tokens=400, seed=1, sort_pool_size=sort_pool_size)
    for epoch in range(3):
        batches = epoch_batches(sampler, epoch)
        assert len(batches) == len(sampler)
        assert all(padded_tokens(source, target, b) <= 400 for b in batches)
        assert sorted(i for b in batches for i in b) == list(range(len(source)))


def test_an_oversized_example_gets_its_own_batch_and_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    source, target = random_lengths(200)
    source[[7, 42]] = 300  # alone already more than the budget
    with caplog.at_level(logging.WARNING, logger="hf_vanilla.data.batching"):
        sampler = TokenBudgetBatchSampler(source, target, max_tokens=250, seed=0)
        for epoch in range(3):
            batches = epoch_batches(sampler, epoch)
            assert [7] in batches and [42] in batches
            assert all(padded_tokens(source, target, b) <= 250 for b in batches if len(b) > 1)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "2 of 200 pairs exceed max_tokens=250" in warnings[0].getMessage()


def test_batches_are_length_homogeneous() -> None:
    source, target = random_lengths(2000)
    sampler = TokenBudgetBatchSampler(source, target, max_tokens=1000, seed=0)
    random_batches = np.array_split(np.random.default_rng(0).permutation(2000), len(sampler))
    budgeted = padding_efficiency(source, target, sampler.global_batches())
    assert budgeted > 0.9 > padding_efficiency(source, target, random_batches)
    pooled = TokenBudgetBatchSampler(source, target, max_tokens=1000, seed=0, sort_pool_size=200)
    assert budgeted > padding_efficiency(source, target, pooled.global_batches()) > 0.8


def test_padding_report() -> None:
    source, target = random_lengths(2000)
    report = padding_report(source, target, max_tokens=1000)
    assert report["batches"] == len(TokenBudgetBatchSampler(source, target, 1000))
    assert report["mean_batch_size"] == pytest.approx(2000 / report["batches"])
    assert 1 >= report["token_budget_efficiency"] > 0.9 > report["random_batches_efficiency"] > 0
    exact = padding_efficiency(np.array([2, 2]), np.array([3, 1]), [[0], [1]])
    assert exact == 1.0 and padding_efficiency(np.array([2, 2]), np.array([3, 1]), [[0, 1]]) == 8 / 10


def test_max_sentences_caps_the_batch_size() -> None:
    source, target = random_lengths()
    sampler = TokenBudgetBatchSampler(source, target, max_tokens=10_000, max_sentences=7)
    assert max(len(b) for b in sampler) == 7


# ---------------------------------------------------------------- epochs and seeds


def test_epochs_differ_and_seeds_reproduce() -> None:
    source, target = random_lengths()
    a = TokenBudgetBatchSampler(source, target, max_tokens=400, seed=5)
    b = TokenBudgetBatchSampler(source, target, max_tokens=400, seed=5)
    c = TokenBudgetBatchSampler(source, target, max_tokens=400, seed=6)
    assert epoch_batches(a, 0) != epoch_batches(a, 1)
    assert epoch_batches(a, 1) == epoch_batches(b, 1)
    assert epoch_batches(a, 0) == epoch_batches(b, 0)  # set_epoch goes back, too
    assert epoch_batches(a, 0) != epoch_batches(c, 0)
    # With a global sort the batch count is the same every epoch (Trainer counts steps once).
    assert len({len(epoch_batches(a, epoch)) for epoch in range(4)}) == 1
    # Without shuffling: one fixed, sorted order.
    fixed = TokenBudgetBatchSampler(source, target, max_tokens=400, shuffle=False)
    assert epoch_batches(fixed, 0) == epoch_batches(fixed, 1)
    assert np.all(np.diff(source[[i for batch in epoch_batches(fixed, 0) for i in batch]]) >= 0)


# ---------------------------------------------------------------- data parallel


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("sort_pool_size", [None, 50])
def test_ranks_partition_the_epoch_with_equal_counts(
    world_size: int, drop_last: bool, sort_pool_size: int | None
) -> None:
    source, target = random_lengths(301)
    samplers = [
        TokenBudgetBatchSampler(
            source,
            target,
            max_tokens=500,
            num_replicas=world_size,
            rank=rank,
            seed=3,
            drop_last=drop_last,
            sort_pool_size=sort_pool_size,
        )
        for rank in range(world_size)
    ]
    for epoch in range(2):
        per_rank = [epoch_batches(s, epoch) for s in samplers]
        counts = {len(batches) for batches in per_rank} | {len(s) for s in samplers}
        assert len(counts) == 1  # equal on every rank, and equal to len()
        global_batches = samplers[0].global_batches()
        dealt = [b for batches in per_rank for b in batches]
        seen = Counter(i for b in dealt for i in b)
        if drop_last:
            assert len(dealt) == len(global_batches) // world_size * world_size
            assert max(seen.values()) == 1
        else:
            assert set(seen) == set(range(len(source)))  # every example at least once
            padding = len(dealt) - len(global_batches)
            assert 0 <= padding < world_size
            # Only the repeated batches (the first of the shuffled list) are seen twice.
            assert sum(seen.values()) - len(source) == sum(len(b) for b in global_batches[:padding])


def test_more_ranks_than_batches() -> None:
    sampler = [
        TokenBudgetBatchSampler([3, 4], [3, 4], max_tokens=100, num_replicas=3, rank=r) for r in range(3)
    ]
    assert [len(list(s)) for s in sampler] == [1, 1, 1]
    with pytest.raises(ValueError, match="drop_last=True leaves no batches"):
        TokenBudgetBatchSampler([3, 4], [3, 4], max_tokens=100, num_replicas=3, drop_last=True)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="equally long"):
        TokenBudgetBatchSampler([1, 2], [1], max_tokens=10)
    with pytest.raises(ValueError, match="empty"):
        TokenBudgetBatchSampler([], [], max_tokens=10)
    with pytest.raises(ValueError, match="rank"):
        TokenBudgetBatchSampler([1], [1], max_tokens=10, num_replicas=2, rank=2)


# ---------------------------------------------------------------- Accelerate


@pytest.mark.parametrize("world_size", [2, 3])
def test_accelerate_wrapper_is_unsharded_and_set_epoch_reaches_the_sampler(world_size: int) -> None:
    source, target = random_lengths(200)
    dataset = list(range(200))
    for rank in range(world_size):
        sampler = TokenBudgetBatchSampler(source, target, 300, num_replicas=world_size, rank=rank, seed=0)
        own = epoch_batches(sampler, 0)
        loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=list)
        prepared = prepare_data_loader(
            loader, num_processes=world_size, process_index=rank, put_on_device=False
        )
        # Accelerate alone deals our (already per-rank) batches round-robin again: most would be lost.
        assert len(list(prepared)) < len(own)
        unshard_prepared_dataloader(prepared, sampler)
        prepared.set_epoch(0)
        assert list(prepared) == own
        # DataLoaderShard advances the epoch after each full pass, and Trainer's set_epoch reaches us too.
        assert list(prepared) == epoch_batches(sampler, 1)
        prepared.set_epoch(4)
        assert sampler.epoch == 4 and list(prepared) == epoch_batches(sampler, 4)
        # Resuming mid-epoch adds skip_first_batches' wrapper; Trainer calls set_epoch one level down.
        resumed = skip_first_batches(prepared, 2)
        resumed.set_epoch(3)
        resumed.batch_sampler.batch_sampler.set_epoch(3)
        assert list(resumed) == epoch_batches(sampler, 3)[2:]


# ---------------------------------------------------------------- Trainer


@pytest.fixture
def one_thread():
    """Tiny models run far faster on one thread than on threads fighting over shared cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _tiny_setup(n_pairs: int = 120):
    from helpers import tiny_config

    from hf_vanilla import VanillaTransformerForConditionalGeneration
    from hf_vanilla.data.numbers import make_demo_splits
    from hf_vanilla.data.tokenization import tokenize_translations, train_tokenizer_from_dataset

    data = make_demo_splits(n_pairs, 0, 0, max_number=999_999, seed=0)
    tokenizer = train_tokenizer_from_dataset(data, "en", "de", vocab_size=300)
    train = tokenize_translations(data["train"], tokenizer, "en", "de")
    model = VanillaTransformerForConditionalGeneration(tiny_config(vocab_size=len(tokenizer)))
    return model, tokenizer, train


class RecordingCollator:
    """DataCollatorForSeq2Seq that remembers each batch's source sequences and padded shapes."""

    def __init__(self, tokenizer, model) -> None:
        self.inner = DataCollatorForSeq2Seq(tokenizer, model=model)
        self.batches: list[list[tuple[int, ...]]] = []
        self.shapes: list[tuple[int, int, int]] = []

    def __call__(self, features):
        self.batches.append([tuple(f["input_ids"]) for f in features])
        out = self.inner(features)
        self.shapes.append((out["input_ids"].shape[0], out["input_ids"].shape[1], out["labels"].shape[1]))
        return out


def _training_args(out: Path, **overrides) -> Seq2SeqTrainingArguments:
    defaults = {
        "output_dir": str(out),
        "num_train_epochs": 2,
        "learning_rate": 1e-3,
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "save_strategy": "no",
        "report_to": "none",
        "logging_strategy": "no",
        "use_cpu": True,
        "seed": 0,
        "disable_tqdm": True,
        "ddp_find_unused_parameters": False,
    }
    return Seq2SeqTrainingArguments(**{**defaults, **overrides})


def test_trainer_one_process_uses_budgeted_batches(tmp_path: Path, one_thread: None) -> None:
    model, tokenizer, train = _tiny_setup()
    collator = RecordingCollator(tokenizer, model)
    max_tokens = 300
    trainer = PaperSeq2SeqTrainer(
        model=model,
        args=_training_args(tmp_path),
        train_dataset=train,
        data_collator=collator,
        processing_class=tokenizer,
        max_tokens=max_tokens,
    )
    sampler = trainer.token_budget_sampler()
    trainer.train()
    per_epoch = len(sampler)
    assert len(collator.batches) == 2 * per_epoch
    assert trainer.state.global_step == 2 * -(-per_epoch // 2)  # gradient accumulation 2
    for n, src_len, tgt_len in collator.shapes:
        assert n * (src_len + tgt_len) <= max_tokens or n == 1
    assert len({n for n, _, _ in collator.shapes}) > 1  # batch sizes follow the lengths, not a fixed count
    every = Counter(tuple(ids) for ids in train["input_ids"])
    epochs = [collator.batches[:per_epoch], collator.batches[per_epoch:]]
    for batches in epochs:
        assert Counter(ids for batch in batches for ids in batch) == every
    assert epochs[0] != epochs[1]
    # Lengths come from the dataset's columns, once.
    np.testing.assert_array_equal(sequence_lengths(train, "labels"), [len(x) for x in train["labels"]])


def test_trainer_without_max_tokens_batches_by_sentence_count(tmp_path: Path, one_thread: None) -> None:
    model, tokenizer, train = _tiny_setup(24)
    collator = RecordingCollator(tokenizer, model)
    trainer = PaperSeq2SeqTrainer(
        model=model,
        args=_training_args(tmp_path, num_train_epochs=1),
        train_dataset=train,
        data_collator=collator,
        processing_class=tokenizer,
    )
    trainer.train()
    assert [n for n, _, _ in collator.shapes] == [4] * 6


@pytest.mark.slow
def test_trainer_two_processes_partition_each_epoch(tmp_path: Path) -> None:
    """Real 2-process DDP (gloo, CPU): equal batch counts per rank, no hang, each example once per epoch."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), str(Path(__file__).parents[1])]),
        "OMP_NUM_THREADS": "1",
    }
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    subprocess.run([*command, __file__, str(tmp_path)], check=True, env=env, timeout=600)
    records = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert [json.loads((tmp_path / f"exit-rank{rank}.json").read_text()) for rank in range(2)] == [0, 0]
    assert records[0]["batches_per_epoch"] == records[1]["batches_per_epoch"] > 0
    per_epoch = records[0]["batches_per_epoch"]
    for epoch in range(2):
        seen = Counter()
        for record in records:
            assert len(record["batches"]) == 2 * per_epoch
            for batch in record["batches"][epoch * per_epoch : (epoch + 1) * per_epoch]:
                seen.update(tuple(ids) for ids in batch)
        every = Counter(tuple(ids) for ids in records[0]["all_inputs"])
        assert set(seen) == set(every)  # every example; a repeat only where padding evens the count
        assert sum(seen.values()) - sum(every.values()) <= max(len(b) for r in records for b in r["batches"])
    assert records[0]["global_step"] == records[1]["global_step"] == 2 * -(-per_epoch // 2)


def _train_and_record(out_dir: str) -> None:
    """One rank of the 2-process run: train 2 epochs with max_tokens and record the batches it saw."""
    model, tokenizer, train = _tiny_setup(90)
    collator = RecordingCollator(tokenizer, model)
    trainer = PaperSeq2SeqTrainer(
        model=model,
        args=_training_args(Path(out_dir)),
        train_dataset=train,
        data_collator=collator,
        processing_class=tokenizer,
        max_tokens=250,
    )
    trainer.train()
    record = {
        "batches_per_epoch": len(trainer.token_budget_sampler()),
        "batches": collator.batches,
        "global_step": trainer.state.global_step,
        "all_inputs": [list(ids) for ids in train["input_ids"]],
    }
    (Path(out_dir) / f"rank{trainer.args.process_index}.json").write_text(json.dumps(record))


def _worker(out_dir: str) -> None:
    """Train, then end the group once the Trainer is gone, as a script driving the stock Trainer under
    torchrun should: left alive, or destroyed under the live Trainer, a gloo group can abort or hang the
    exit (see end_process_group)."""
    _train_and_record(out_dir)
    end_process_group()
    (Path(out_dir) / f"exit-rank{os.environ['RANK']}.json").write_text(json.dumps(gloo_threads()))


if __name__ == "__main__":
    _worker(sys.argv[1])
