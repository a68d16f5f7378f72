"""The data path at full WMT14 size: tokenizer training, tokenization into the cache,
token-budget batching, and the first training steps at base size, on a synthetic corpus.

**The corpus** is generated at run time (nothing large is committed) with WMT14 EN-DE-like length
statistics: 4.5 M pairs in the real corpus, ≈ 115 M words per side, i.e. a mean of ≈ 25 words per
sentence with a long right tail. Here: English lengths are log-normal (median 20 words, σ 0.65, so a
mean of ≈ 25), clipped to 1–250 words; the German side has the English length × a log-normal ratio
(median 0.95, σ 0.15). Words are drawn from a Zipf-like (rank^-1.1) vocabulary of 300 k random
lower-case "words" of 2–12 letters per language, so the BPE sees a realistic long tail of rare
words. The tokenizer is the paper's 37 k shared byte-level BPE.

**The stages** run each in a fresh process (so that each peak memory is its own) through the public
commands and APIs. Two peaks: ``peak_gb`` is ``resource.getrusage(RUSAGE_SELF).ru_maxrss``, all
resident pages, those of memory-mapped Arrow files included (the kernel's page cache, dropped under
memory pressure); ``peak_anon_gb`` is the largest ``RssAnon`` (the process's own memory: Python
objects, buffers), sampled every 0.1 s. ``cpu_s`` is the process's CPU time (all threads, imports
included), which the machine's load does not inflate as it does the wall time.

1. ``corpus``: write ``train.en``/``train.de`` (not part of the data path; timed for information).
2. ``read``: stream the text into an Arrow file in an empty `datasets` cache
   (:func:`hf_vanilla.data.loading.load_from_args`; ``HF_DATASETS_CACHE`` is the work folder's
   ``hf_datasets``), which the later stages find there, as a user's later commands do.
3. ``tokenizer``: ``hf-vanilla-train-tokenizer --vocab_size 37000`` (strided ≤ 1 M-pair sample).
4. ``tokenize``: tokenize the text into an empty cache
   (:func:`hf_vanilla.data.cache.cached_tokenization`, as ``hf-vanilla-train`` does).
5. ``batching``: a new process finds the warm cache (memory-mapped), builds one epoch of token-budget
   batches of the whole corpus (``TokenBudgetBatchSampler``, 6250 tokens: the paper's 25 k + 25 k over
   8 GPUs) and runs ``--batches`` of them through the Trainer's collator in a ``DataLoader``: the
   data path's token rate, one loader process.
6. ``first_steps``: ``hf-vanilla-train --preset base`` on the warm cache, 1 step: the time from the
   process start to the first training step, and the steps' time (CPU: for information only).

**What 8 GPUs consume** (the ``--gpu_tokens_per_s`` assumption): the paper trained base on 8 P100
at ≈ 0.4 s per step of ≈ 25 k + 25 k tokens (§5.2), i.e. ≈ 125 k tokens/s; Ott et al. 2018
("Scaling Neural Machine Translation", arXiv:1806.00187) trained ≈ 5× faster on 8 V100 with fp16.
So by default 8 GPUs consume 5 × 125 k = 625 k tokens/s, ≈ 78 k per GPU. Under DDP every GPU has
its own loader process, so the target (data path ≥ 3× what the GPUs consume) is checked per
process: one loader's rate ≥ 3 × 78 k tokens/s.

Run ``python -m benchmarks.data_path.run --pairs 500000 1500000 4500000 --workdir /tmp/dp`` (the work
folder holds the corpus, its Arrow copy, tokenizer, cache and run: ≈ 6 GB at 4.5 M pairs; delete it
afterwards).
"""

from __future__ import annotations

import time

START = time.time()  # before the heavy imports: a launch's time to its first step includes them

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks.common.results import metadata  # noqa: E402

VOCAB_SIZE, MAX_TOKENS = 37000, 6250
PAPER_8_GPU_TOKENS_PER_S = 5 * 50000 / 0.4  # Vaswani et al. §5.2 × Ott et al. 2018's ≈ 5× speed-up


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


class AnonPeak(threading.Thread):
    """The largest ``RssAnon`` of this process, sampled every 0.1 s (the kernel keeps no peak of it)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = 0

    def run(self) -> None:
        while True:
            with open("/proc/self/status") as handle:
                kib = next(int(line.split()[1]) for line in handle if line.startswith("RssAnon:"))
            self.peak = max(self.peak, kib)
            time.sleep(0.1)


def rss_gb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def folder_gb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**30


# ---------------------------------------------------------------------------------------------------
# Stages (each in its own process)
# ---------------------------------------------------------------------------------------------------


def _words(rng: np.random.Generator, count: int) -> list[str]:
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    lengths = rng.integers(2, 13, count)
    chars = letters[rng.integers(0, 26, int(lengths.sum()))].tobytes().decode()
    ends = np.cumsum(lengths)
    return [chars[e - n : e] for e, n in zip(ends.tolist(), lengths.tolist(), strict=True)]


def stage_corpus(work: Path, pairs: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    vocab = {lang: np.array(_words(rng, 300_000), dtype=object) for lang in ("en", "de")}
    weights = 1.0 / np.arange(1, 300_001) ** 1.1
    cdf = np.cumsum(weights / weights.sum())
    folder = work / "corpus"
    folder.mkdir(parents=True, exist_ok=True)
    words = 0
    with open(folder / "train.en", "w") as en, open(folder / "train.de", "w") as de:
        for start in range(0, pairs, 100_000):
            n = min(100_000, pairs - start)
            en_len = np.clip(np.round(rng.lognormal(np.log(20), 0.65, n)), 1, 250).astype(np.int64)
            de_len = np.clip(np.round(en_len * rng.lognormal(np.log(0.95), 0.15, n)), 1, 250).astype(np.int64)
            for lang, lengths, handle in (("en", en_len, en), ("de", de_len, de)):
                ids = np.searchsorted(cdf, rng.random(int(lengths.sum())))
                tokens = vocab[lang][np.minimum(ids, len(cdf) - 1)].tolist()
                ends = np.cumsum(lengths).tolist()
                handle.write(
                    "\n".join(
                        " ".join(tokens[e - k : e]) for e, k in zip(ends, lengths.tolist(), strict=True)
                    )
                    + "\n"
                )
                words += int(lengths.sum())
    return {"pairs": pairs, "words_per_side": words / 2, "disk_gb": folder_gb(folder)}


def stage_read(work: Path, pairs: int) -> dict[str, Any]:
    from hf_vanilla.data.loading import load_from_args
    from hf_vanilla.data.options import DataArguments

    shutil.rmtree(work / "hf_datasets", ignore_errors=True)
    begin = time.time()
    train = load_from_args(DataArguments(train_files=[str(work / "corpus" / "train")]))["train"]
    wall = time.time() - begin
    if len(train) != pairs:
        raise SystemExit(f"read {len(train)} pairs, expected {pairs}")
    return {"wall_s": wall, "pairs_per_s": pairs / wall, "arrow_gb": folder_gb(work / "hf_datasets")}


def stage_tokenizer(work: Path, pairs: int) -> dict[str, Any]:
    from hf_vanilla.cli.train_tokenizer import main

    argv = ["--train_files", str(work / "corpus" / "train"), "--vocab_size", str(VOCAB_SIZE)]
    rc = main([*argv, "--output_dir", str(work / "tokenizer"), "--overwrite"])
    if rc:
        raise SystemExit(f"hf-vanilla-train-tokenizer failed ({rc})")
    return {}


def _tokenized(work: Path) -> tuple[Any, Any]:
    import functools

    from hf_vanilla.data.cache import cached_tokenization, data_fingerprint
    from hf_vanilla.data.loading import load_from_args
    from hf_vanilla.data.options import DataArguments
    from hf_vanilla.data.tokenization import load_tokenizer, tokenize_translations

    args = DataArguments(train_files=[str(work / "corpus" / "train")])
    tokenizer = load_tokenizer(work / "tokenizer")
    tokenize = functools.partial(
        tokenize_translations, tokenizer=tokenizer, source_lang="en", target_lang="de", desc="Tokenizing"
    )
    key = data_fingerprint(args, tokenizer, None, None)
    return cached_tokenization(work / "cache", key, lambda: load_from_args(args), tokenize), tokenizer


def stage_tokenize(work: Path, pairs: int) -> dict[str, Any]:
    from hf_vanilla.data.batching import sequence_lengths

    shutil.rmtree(work / "cache", ignore_errors=True)
    begin = time.time()
    train = _tokenized(work)[0]["train"]
    wall = time.time() - begin
    tokens = int(sequence_lengths(train, "input_ids").sum() + sequence_lengths(train, "labels").sum())
    return {"wall_s": wall, "tokens": tokens, "cache_gb": folder_gb(work / "cache"), "rss_after_gb": rss_gb()}


def stage_batching(work: Path, pairs: int, batches: int) -> dict[str, Any]:
    from torch.utils.data import DataLoader
    from transformers import DataCollatorForSeq2Seq

    from hf_vanilla.data.batching import TokenBudgetBatchSampler, sequence_lengths

    begin = time.time()
    data, tokenizer = _tokenized(work)
    train = data["train"]
    warm_load = time.time() - begin
    begin = time.time()
    sampler = TokenBudgetBatchSampler(
        sequence_lengths(train, "input_ids"), sequence_lengths(train, "labels"), MAX_TOKENS, seed=0
    )
    epoch_batches = len(sampler)
    plan = time.time() - begin
    loader = DataLoader(
        train,
        batch_sampler=sampler,
        collate_fn=DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100),
    )
    begin, padded, real, seen = time.time(), 0, 0, 0
    for batch in loader:
        padded += batch["input_ids"].numel() + batch["labels"].numel()
        real += int(batch["attention_mask"].sum() + (batch["labels"] != -100).sum())
        seen += 1
        if seen == batches:
            break
    rate_wall = time.time() - begin
    return {
        "warm_load_s": warm_load,
        "plan_s": plan,
        "epoch_batches": epoch_batches,
        "loader_batches": seen,
        "loader_s": rate_wall,
        "padded_tokens_per_s": padded / rate_wall,
        "real_tokens_per_s": real / rate_wall,
        "rss_after_gb": rss_gb(),
    }


def stage_first_steps(work: Path, pairs: int) -> dict[str, Any]:
    import transformers

    from hf_vanilla.cli.train import main

    steps: list[float] = []
    original = transformers.Trainer.training_step

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        steps.append(time.time())
        return original(self, *args, **kwargs)

    transformers.Trainer.training_step = timed
    argv = [
        "--train_files", str(work / "corpus" / "train"),
        "--tokenizer_name_or_path", str(work / "tokenizer"),
        "--tokenized_cache_dir", str(work / "cache"),
        "--preset", "base",
        "--max_tokens", str(MAX_TOKENS),
        "--max_steps", "1",
        "--eval_strategy", "no", "--save_strategy", "no", "--do_eval", "False",
        "--report_to", "none", "--dataloader_num_workers", "0",
        "--output_dir", str(work / "run"), "--overwrite",
    ]  # fmt: skip
    rc = main(argv)
    end = time.time()
    if rc:
        raise SystemExit(f"hf-vanilla-train failed ({rc})")
    return {"to_first_step_s": steps[0] - START, "steps_s": end - steps[0], "steps": len(steps)}


STAGES = ("corpus", "read", "tokenizer", "tokenize", "batching", "first_steps")


def run_stage(name: str, work: Path, pairs: int, batches: int) -> dict[str, Any]:
    anon = AnonPeak()
    anon.start()
    begin = time.time()
    if name == "batching":
        result = stage_batching(work, pairs, batches)
    else:
        result = globals()[f"stage_{name}"](work, pairs)
    result.setdefault("wall_s", time.time() - begin)
    result.update(stage=name, pairs=pairs, peak_gb=peak_gb(), process_s=time.time() - START)
    result["peak_anon_gb"] = anon.peak / 2**20
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result["cpu_s"] = usage.ru_utime + usage.ru_stime  # all threads, imports included: load-independent
    return result


# ---------------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------------


def child(name: str, work: Path, pairs: int, batches: int, timeout: float) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "benchmarks.data_path.run",
        "--stage",
        name,
        "--workdir",
        str(work),
        "--pairs",
        str(pairs),
    ]
    command += ["--batches", str(batches)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="true")
    env["HF_DATASETS_CACHE"] = str(work / "hf_datasets")  # the text's Arrow file, cold at the `read` stage
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode:
        raise SystemExit(f"stage {name} at {pairs} pairs failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(report: dict[str, Any]) -> dict[str, Any]:
    """The comparison's table (:mod:`benchmarks.common.results`): each stage's wall and CPU seconds and
    peak memory, at each corpus size."""
    rows = [
        [
            stage["stage"],
            f"{stage['pairs']:,}",
            f"{stage['wall_s']:.1f}",
            f"{stage['cpu_s']:.0f}",
            f"{stage['peak_gb']:.2f} / {stage['peak_anon_gb']:.2f}",
        ]
        for stage in report["stages"]
    ]
    return {
        "title": "The data path at WMT14 size, synthetic corpus",
        "columns": ["stage", "pairs", "wall s", "CPU s", "RSS / anon peak GB"],
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, nargs="+", default=[500_000, 1_500_000, 4_500_000])
    parser.add_argument("--workdir", type=Path, required=True, help="Scratch folder (≈ 6 GB at 4.5 M pairs).")
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    parser.add_argument("--batches", type=int, default=3000, help="Batches timed through the DataLoader.")
    parser.add_argument("--gpu_tokens_per_s", type=float, default=PAPER_8_GPU_TOKENS_PER_S)
    parser.add_argument("--timeout", type=float, default=3600, help="Seconds per stage.")
    parser.add_argument("--results", type=Path, help="Append each stage's JSON line to this file.")
    parser.add_argument("--json_out", type=Path, help="Write every stage and the table here as JSON.")
    parser.add_argument("--stage", choices=STAGES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stage:  # a child: one stage, one JSON line
        print(json.dumps(run_stage(args.stage, args.workdir, args.pairs[0], args.batches)))
        return
    stages: list[dict[str, Any]] = []
    for pairs in args.pairs:
        work = args.workdir / f"{pairs}"
        for name in args.stages:
            result = child(name, work, pairs, args.batches, args.timeout)
            if name == "batching":
                per_gpu = args.gpu_tokens_per_s / 8
                result["x_per_gpu_need"] = result["padded_tokens_per_s"] / per_gpu
            print(json.dumps(result), flush=True)
            stages.append(result)
            if args.json_out:
                report = {"meta": metadata(), "stages": stages}
                args.json_out.write_text(json.dumps({**report, "table": table(report)}, indent=2) + "\n")
            if args.results:
                with open(args.results, "a") as handle:
                    handle.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
