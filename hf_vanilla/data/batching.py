"""Token-budget batching (§5.1): batches of similar-length pairs holding up to a fixed number of tokens.

The paper: "Sentence pairs were batched together by approximate sequence length. Each training batch
contained a set of sentence pairs containing approximately 25000 source tokens and 25000 target tokens"
(§5.1), on 8 GPUs. Batching by tokens rather than by sentences keeps the work per step steady and wastes
little compute on padding.

**The budget.** A batch of `n` pairs whose longest source has `S` tokens and longest target `T` tokens
costs `n × (S + T)` tokens: its padded size, source plus target, before any `pad_to_multiple_of` in the
collator. `max_tokens` bounds that cost per batch, i.e. per process and micro-step. One optimizer step
therefore sees at most `max_tokens × world_size × gradient_accumulation_steps` padded tokens; the paper's
~25k + 25k over 8 GPUs is `max_tokens ≈ 6250` per GPU, or one process with `max_tokens=6250` and
gradient accumulation 8. A pair longer than the budget on its own gets a batch of its own (logged once).

**An epoch** (deterministic in `(seed, epoch)`; call `set_epoch` each epoch, as with `DistributedSampler`):

1. order the pairs by (source length, target length), ties broken at random — or, with `sort_pool_size=k`,
   shuffle all pairs and sort only within consecutive pools of `k` ("bucketed random": similar lengths,
   different batch mates every epoch, slightly more padding);
2. cut the order greedily into batches that fit the budget (and `max_sentences`, if set);
3. shuffle the batch order;
4. deal the batches round-robin to the `num_replicas` ranks. Every rank gets the same number of batches
   — otherwise DDP waits forever on the rank that still has a batch. When the count does not divide,
   the first batches of the shuffled list are repeated to fill the last round (like `DistributedSampler`),
   so a few pairs are seen twice that epoch; `drop_last=True` drops the incomplete round instead. Apart
   from that, the ranks' batches partition the data: each pair exactly once per epoch.

With global sorting the sorted length sequence, hence the batch count, is the same every epoch. With
`sort_pool_size` it varies by a few batches between epochs; `len()` is exact for the current epoch, but
`Trainer` counts the steps of an epoch once, from the first.

**With `Trainer` and Accelerate.** `hf_vanilla.training.trainer.PaperSeq2SeqTrainer` builds the rank-aware sampler above and
passes it as the DataLoader's `batch_sampler`. With several processes, `accelerator.prepare` (accelerate
1.x) wraps any batch sampler in a `BatchSamplerShard` that deals its batches round-robin over the
processes — which would shard our already-sharded batches a second time and drop most of them. As
transformers does for its own rank-aware `BatchRebalanceSampler`, the wrapper is made a pass-through
(`num_processes=1`). `set_epoch` reaches the sampler both ways: `DataLoaderShard.set_epoch` calls
`batch_sampler.set_epoch` (one process), and `Trainer` calls it on the sampler inside the wrapper (several
processes); the wrapper also gets a forwarding `set_epoch` so that resuming mid-epoch, where
`skip_first_batches` adds one more wrapper, still reaches it. Accelerate's `split_batches` and
`dispatch_batches` modes are refused: they cut or re-deal batches by sentence count.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any

import datasets
import numpy as np
import pyarrow.compute as pc
from torch.utils.data import Sampler

logger = logging.getLogger(__name__)


def sequence_lengths(dataset: Any, column: str) -> np.ndarray:
    """Lengths of the sequences in `column` of a tokenized dataset, as an int64 array (computed once).

    For a `datasets.Dataset` this reads the Arrow list lengths without decoding the token ids.
    """
    if isinstance(dataset, datasets.Dataset):
        if column not in dataset.column_names:
            raise ValueError(
                f"Token-budget batching needs the tokenized column {column!r}; the dataset has "
                f"{dataset.column_names}. Tokenize first (hf_vanilla.data.tokenization.tokenize_translations)."
            )
        table = dataset.select_columns([column]).with_format("arrow")[:]
        return pc.list_value_length(table.column(column)).to_numpy(zero_copy_only=False).astype(np.int64)
    try:
        return np.array([len(dataset[i][column]) for i in range(len(dataset))], dtype=np.int64)
    except (KeyError, TypeError) as err:
        raise ValueError(
            f"Cannot read sequence lengths from column {column!r} of {type(dataset).__name__}."
        ) from err


def padded_tokens(source_lengths: np.ndarray, target_lengths: np.ndarray, batch: Sequence[int]) -> int:
    """The budget's cost of a batch: `len(batch) × (max source length + max target length)`."""
    index = np.asarray(batch)
    return len(index) * int(source_lengths[index].max() + target_lengths[index].max())


def padding_efficiency(
    source_lengths: np.ndarray, target_lengths: np.ndarray, batches: Sequence[Sequence[int]]
) -> float:
    """Real tokens / padded tokens over `batches` (source and target together); 1.0 means no padding."""
    real = sum(int(source_lengths[b].sum() + target_lengths[b].sum()) for b in map(np.asarray, batches))
    padded = sum(padded_tokens(source_lengths, target_lengths, b) for b in batches)
    return real / padded


def padding_report(
    source_lengths: np.ndarray,
    target_lengths: np.ndarray,
    max_tokens: int,
    seed: int = 0,
    sort_pool_size: int | None = None,
) -> dict[str, float]:
    """Padding efficiency of one epoch of token-budget batches vs. random batches of the same mean size.

    The baseline shuffles the data and cuts it into sentence-count batches of the token-budget batches'
    mean size (rounded), as `per_device_train_batch_size` batching would.
    """
    source_lengths, target_lengths = np.asarray(source_lengths), np.asarray(target_lengths)
    budgeted = TokenBudgetBatchSampler(
        source_lengths, target_lengths, max_tokens, seed=seed, sort_pool_size=sort_pool_size
    ).global_batches()
    mean_size = len(source_lengths) / len(budgeted)
    size = max(1, round(mean_size))
    order = np.random.default_rng(seed).permutation(len(source_lengths))
    random_batches = [order[i : i + size] for i in range(0, len(order), size)]
    return {
        "batches": len(budgeted),
        "mean_batch_size": mean_size,
        "token_budget_efficiency": padding_efficiency(source_lengths, target_lengths, budgeted),
        "random_batches_efficiency": padding_efficiency(source_lengths, target_lengths, random_batches),
    }


def _pack(
    order: np.ndarray, source: np.ndarray, target: np.ndarray, max_tokens: int, max_sentences: int | None
) -> list[int]:
    """Greedy cut of `order` into budgeted batches; returns the end offsets of the batches."""
    src, tgt = source[order].tolist(), target[order].tolist()
    cap = max_sentences or len(src)
    ends, start, max_src, max_tgt = [], 0, 0, 0
    for i, (s, t) in enumerate(zip(src, tgt, strict=True)):
        new_src, new_tgt = max(max_src, s), max(max_tgt, t)
        size = i - start
        if size and (size >= cap or (size + 1) * (new_src + new_tgt) > max_tokens):
            ends.append(i)
            start, new_src, new_tgt = i, s, t
        max_src, max_tgt = new_src, new_tgt
    ends.append(len(src))
    return ends


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Rank-aware batch sampler: batches of at most `max_tokens` padded source+target tokens (§5.1).

    Yields this rank's batches (lists of dataset indices) for the current epoch; see the module docstring
    for the budget, the epoch order and the guarantees under data parallelism.

    Args:
        source_lengths, target_lengths: token counts per pair (e.g. of `input_ids` and `labels`).
        max_tokens: budget per batch, `batch size × (max source len + max target len)`.
        num_replicas, rank: data-parallel world size and this process's index.
        shuffle: random tie-breaking, pools and batch order; False gives one fixed sorted order.
        seed: all ranks must use the same seed (they compute the same global batches).
        sort_pool_size: None sorts globally; k sorts within random pools of k pairs.
        max_sentences: optional cap on pairs per batch.
        drop_last: drop the last, incomplete round of batches instead of repeating batches to fill it.
    """

    def __init__(
        self,
        source_lengths: Sequence[int] | np.ndarray,
        target_lengths: Sequence[int] | np.ndarray,
        max_tokens: int,
        *,
        num_replicas: int = 1,
        rank: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        sort_pool_size: int | None = None,
        max_sentences: int | None = None,
        drop_last: bool = False,
    ) -> None:
        self.source_lengths = np.asarray(source_lengths, dtype=np.int64)
        self.target_lengths = np.asarray(target_lengths, dtype=np.int64)
        if self.source_lengths.ndim != 1 or self.source_lengths.shape != self.target_lengths.shape:
            raise ValueError(
                f"source_lengths and target_lengths must be 1-D and equally long, got shapes "
                f"{self.source_lengths.shape} and {self.target_lengths.shape}."
            )
        if len(self.source_lengths) == 0:
            raise ValueError("The dataset is empty: nothing to batch.")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive number of tokens, got {max_tokens}.")
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(
                f"Need num_replicas >= 1 and 0 <= rank < num_replicas, got {num_replicas=}, {rank=}."
            )
        if sort_pool_size is not None and sort_pool_size < 1:
            raise ValueError(f"sort_pool_size must be None (global sort) or >= 1, got {sort_pool_size}.")
        if max_sentences is not None and max_sentences < 1:
            raise ValueError(f"max_sentences must be None or >= 1, got {max_sentences}.")
        self.max_tokens, self.num_replicas, self.rank = max_tokens, num_replicas, rank
        self.shuffle, self.seed, self.sort_pool_size = shuffle, seed, sort_pool_size
        self.max_sentences, self.drop_last = max_sentences, drop_last
        self.epoch = 0
        self._cache: tuple[int, list[np.ndarray]] | None = None

        sizes = self.source_lengths + self.target_lengths
        too_long = int((sizes > max_tokens).sum())
        if too_long:
            logger.warning(
                "%d of %d pairs exceed max_tokens=%d on their own (longest: %d source + target tokens); each of "
                "them gets a batch of its own. Raise max_tokens or truncate (max_source_length/max_target_length).",
                too_long,
                len(sizes),
                max_tokens,
                int(sizes.max()),
            )
        # With a global sort, the sorted length sequence and so the batch boundaries are the same every epoch.
        self._fixed_ends = None
        if sort_pool_size is None:
            order = np.lexsort((self.target_lengths, self.source_lengths))
            self._fixed_ends = _pack(
                order, self.source_lengths, self.target_lengths, max_tokens, max_sentences
            )
        if self.drop_last and len(self) == 0:
            raise ValueError(
                f"drop_last=True leaves no batches: the epoch has {len(self.global_batches())} batches for "
                f"{num_replicas} ranks. Lower max_tokens, or set drop_last=False."
            )

    def set_epoch(self, epoch: int) -> None:
        """Use the order of `epoch` (0, 1, ...) from the next `iter()` on."""
        self.epoch = epoch

    def _rng(self) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.epoch])

    def global_batches(self) -> list[np.ndarray]:
        """All batches of the current epoch, over all ranks, in the shuffled order (before padding)."""
        if self._cache is not None and self._cache[0] == self.epoch:
            return self._cache[1]
        rng = self._rng()
        src, tgt = self.source_lengths, self.target_lengths
        n = len(src)
        if self.sort_pool_size is None:
            tie_break = rng.random(n) if self.shuffle else np.arange(n)
            order = np.lexsort((tie_break, tgt, src))
            ends = self._fixed_ends
        else:
            permutation = rng.permutation(n) if self.shuffle else np.arange(n)
            pools = [permutation[i : i + self.sort_pool_size] for i in range(0, n, self.sort_pool_size)]
            order = np.concatenate([pool[np.lexsort((tgt[pool], src[pool]))] for pool in pools])
            ends = _pack(order, src, tgt, self.max_tokens, self.max_sentences)
        batches = np.split(order, ends[:-1])
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        self._cache = (self.epoch, batches)
        return batches

    def _num_batches_per_rank(self, num_global: int) -> int:
        if self.drop_last:
            return num_global // self.num_replicas
        return math.ceil(num_global / self.num_replicas)

    def __len__(self) -> int:
        """Batches this rank yields in the current epoch (equal on every rank)."""
        return self._num_batches_per_rank(len(self.global_batches()))

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.global_batches()
        total = self._num_batches_per_rank(len(batches)) * self.num_replicas
        padded = (batches * math.ceil(total / len(batches)))[:total]  # repeat from the start when short
        for batch in padded[self.rank :: self.num_replicas]:
            yield batch.tolist()
