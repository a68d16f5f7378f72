"""Where a beam-search step's time goes on real text: the trained model of
``benchmarks/real_text/run.py`` translating the Multi30k validation sentences at ``--batch_size`` (sorted by
length, as :func:`hf_vanilla.inference.translation.translate` batches them), beam 4, α = 0.6.

Timers around the model's own calls split each ``generate()``:

* **encoder**: the encoder over the padded sources, once per batch;
* **decoder forward**: every decoding step's forward (decoder, cache, output projection);
* **search**: the rest of ``generate()``: transformers' beam-search bookkeeping (log-softmax over the
  full vocabulary, top-k, gathers, cache reordering through ``_reorder_cache``, logits processors,
  stopping checks) and its set-up;
* **finished sentences**: the share of the decoder forward spent on rows of sentences whose search is
  already over (no hypothesis can still enter their n-best list: transformers' early-stop state), the
  forward time of each step × the fraction of such rows in it (rows cost about the same): the rows
  beyond those of the sentences still open at the last check (none where finished sentences leave
  the batch; ``--keep_finished`` keeps them);
* **source padding**: padded source positions over all source positions of the batches (the encoder and
  the cross-attention compute them).

``--torch_profile N`` also prints torch.profiler's operator table over the first N batches.

    python -m benchmarks.real_text.profile --model_dir /tmp/rt27/recipe/averaged --early_stopping never
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.real_text.run import read_lines
from hf_vanilla.inference.decoding import paper_generation_kwargs
from hf_vanilla.inference.loading import load_model_and_tokenizer
from hf_vanilla.inference.options import DecodingOptions, InferenceModelArguments


class StepTimer:
    """Wraps a model's encoder, forward and early-stop check with timers for one ``generate()`` call."""

    def __init__(self, model: Any) -> None:
        self.encoder_s = 0.0
        self.steps: list[tuple[float, float]] = []  # (forward seconds, fraction of rows already finished)
        self.rows = 0  # rows of the last forward
        # Rows of sentences whose search is not over, at the last check (None: no check yet). The next
        # forward's other rows are finished sentences' (transformers' loop keeps them; the loop that
        # drops finished sentences has none left).
        self.open_rows: int | None = None
        encoder = model.get_encoder()
        encoder.forward = self._timed(encoder.forward, "encoder")
        model.forward = self._timed(model.forward, "forward")
        check = model._check_early_stop_heuristic

        @functools.wraps(check)
        def checked(*args: Any, **kwargs: Any) -> torch.Tensor:
            unsatisfied = check(*args, **kwargs)  # (B, 1): the sentence may still get a better hypothesis
            done = ~unsatisfied[:, 0]
            if kwargs["early_stopping"] is True:
                done |= kwargs["is_sent_finished"].all(dim=-1)
            sentences = done.shape[0]  # the rows of the last forward hold each one's hypotheses
            self.open_rows = self.rows * (sentences - int(done.sum())) // sentences
            return unsatisfied

        model._check_early_stop_heuristic = checked

    def _timed(self, call: Callable[..., Any], what: str) -> Callable[..., Any]:
        @functools.wraps(call)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = call(*args, **kwargs)
            seconds = time.perf_counter() - start
            if what == "encoder":
                self.encoder_s += seconds
                return out
            self.rows = kwargs["decoder_input_ids"].shape[0]
            finished = 0.0 if self.open_rows is None else max(0, self.rows - self.open_rows) / self.rows
            self.steps.append((seconds, finished))
            return out

        return timed

    def reset(self) -> None:
        self.encoder_s, self.steps, self.rows, self.open_rows = 0.0, [], 0, None


def profile(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model_and_tokenizer(
        InferenceModelArguments(
            args.model_dir, device="cpu", dtype=args.dtype, quantization=args.quantization
        )
    )
    model.drop_finished_sentences = not args.keep_finished
    sentences = read_lines(Path(args.data_dir) / "val.de.gz", args.sentences)
    ids = tokenizer(sentences)["input_ids"]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]), reverse=True)
    batches = [order[i : i + args.batch_size] for i in range(0, len(order), args.batch_size)]
    kwargs = paper_generation_kwargs(
        DecodingOptions(num_beams=args.num_beams, early_stopping=args.early_stopping)
    )
    timer = StepTimer(model)
    totals = {"generate": 0.0, "encoder": 0.0, "forward": 0.0, "finished": 0.0, "steps": 0, "rows_steps": 0}
    padded = real = 0
    profiler = None
    if args.torch_profile:
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        profiler.__enter__()
    with torch.inference_mode():
        for number, batch in enumerate(batches):
            if profiler is not None and number == args.torch_profile:
                profiler.__exit__(None, None, None)
                sys.stdout.write(
                    profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=20) + "\n"
                )
                profiler = None
            encoded = tokenizer.pad({"input_ids": [ids[i] for i in batch]}, return_tensors="pt")
            padded += encoded["attention_mask"].numel()
            real += int(encoded["attention_mask"].sum())
            timer.reset()
            start = time.perf_counter()
            out = model.generate(**encoded, **kwargs)
            totals["generate"] += time.perf_counter() - start
            totals["encoder"] += timer.encoder_s
            totals["forward"] += sum(seconds for seconds, _ in timer.steps)
            totals["finished"] += sum(seconds * share for seconds, share in timer.steps)
            totals["steps"] += len(timer.steps)
            totals["rows_steps"] += len(timer.steps) * out.shape[0]
    totals["search"] = totals["generate"] - totals["encoder"] - totals["forward"]
    totals["source_padding"] = 1 - real / padded
    totals["batches"] = len(batches)
    return totals


def report(totals: dict[str, Any]) -> str:
    whole = totals["generate"]
    rows = [
        ("generate() in all", whole),
        ("encoder", totals["encoder"]),
        ("decoder forward (all steps)", totals["forward"]),
        ("  of which rows of finished sentences", totals["finished"]),
        ("search bookkeeping (rest of generate())", totals["search"]),
    ]
    lines = ["| part | seconds | share |", "|---|---|---|"]
    lines += [f"| {name} | {seconds:.2f} | {100 * seconds / whole:.0f} % |" for name, seconds in rows]
    lines.append(f"| decoding steps (batches) | {totals['steps']} ({totals['batches']}) | — |")
    lines.append(f"| source padding (share of positions) | — | {100 * totals['source_padding']:.0f} % |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--data_dir", default="/work/shared/data/multi30k")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--num_beams", type=int, default=4)
    parser.add_argument("--early_stopping", default="never", choices=["never", "true", "false"])
    parser.add_argument("--sentences", type=int, default=None, help="Only the first N sentences.")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="auto", help="As hf-vanilla-translate's --dtype (e.g. bfloat16).")
    parser.add_argument(
        "--quantization", default="none", help="As hf-vanilla-translate's --quantization (e.g. dynamic-int8)."
    )
    parser.add_argument("--torch_profile", type=int, default=0, help="Operator table of the first N batches.")
    parser.add_argument(
        "--keep_finished",
        action="store_true",
        help="Run transformers' own beam-search loop, which keeps computing finished sentences.",
    )
    parser.add_argument("--json_out")
    args = parser.parse_args()
    totals = profile(args)
    sys.stdout.write(report(totals))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(totals, indent=2) + "\n")


if __name__ == "__main__":
    main()
