"""Real text, trained model: every decoding route of hf_vanilla against CTranslate2.

``benchmarks/ct2/run.py`` times random weights that never end a hypothesis; this benchmark times what a
user runs: a trained model (``--model_dir``, e.g. the one ``recipes/multi30k.sh`` writes) translating
the Multi30k validation German sentences (``--data_dir``, ``val.de.gz``; never copied into the
repository) into English, scored with sacreBLEU against ``val.en.gz``.

Routes: ``fp32``, ``bf16`` (``--dtype bfloat16``), ``int8`` (``--quantization dynamic-int8``), ``ct2-fp32``
and ``ct2-int8`` (the project's CTranslate2 export and backend), ``onnx`` (the ONNX export's
``generate()``; it has no command), and ``fp32-keep`` / ``int8-keep``: transformers' own beam-search
loop, which goes on computing sentences whose search is over (``drop_finished_sentences=False``; the
speed path's before), and ``replay``: ``generate()`` over a model that costs nothing (the fp32 model's
outputs, recorded in an untimed run just before, replayed: ``benchmarks.real_text.worker.Replay``), i.e. what
``generate()`` itself costs, the floor of every route through it. Decodings: beam 4 with the paper's stopping rule
(``early_stopping="never"``, the default), beam 4 with ``early_stopping=True``, greedy; CTranslate2 has
one stopping rule of its own, so its two beam cases are one (``beam4``). Batch sizes: ``--batch_sizes``;
batch 1 translates the first ``--batch1_sentences`` sentences only.

Two modes per case:

* ``generate``: the model is loaded once, in a worker process of its route's own; the timed part is
  :func:`hf_vanilla.inference.translation.translate` (tokenizing, batching, ``generate()`` per batch,
  detokenizing): the decoding loop alone. One process per route because engines in one process slow each
  other: CTranslate2 and ONNX Runtime bring their own thread pools, and once they have run, torch's
  dynamic-int8 ``translate()`` took 13.0 s instead of 8.5–9.9 s alone (recipe model, beam 4, batch 32,
  2026-12-02). Idle workers wait on a pipe; the runner pauses ``--settle`` seconds before each case.
* ``cli``: the whole ``hf-vanilla-translate`` command (start, imports, loading, translating, writing),
  timed from outside. ``cli-start`` is the command on one short sentence, greedy: its fixed cost.

Cases run round-robin (every case once per round, ``--rounds`` rounds) after one untimed warm-up batch in
each worker; the JSON (``--json_out``) keeps every run, :func:`summarize` turns one or more of them into
the Markdown table of benchmarks/RESULTS.md (medians and min–max over all rounds):

    python -m benchmarks.real_text.run --model_dir /tmp/rt27/recipe/averaged --json_out /tmp/rt27/a.json
    python -m benchmarks.real_text.run --summarize /tmp/rt27/a.json /tmp/rt27/b.json

Words/s counts the source words (whitespace-separated) of the sentences translated, the same for every
route. Threads: ``--threads`` for torch, ONNX Runtime and CTranslate2 (``OMP_NUM_THREADS`` for the
commands); ``--ct2_threads`` gives CTranslate2 a count of its own (on the 2-core VM of RESULTS.md its
int8 decoding runs 2–8× faster on one thread than on two).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sacrebleu
import torch

from benchmarks.common.engine_process import CT2_THREADS_HELP, EngineProcess, engine_threads
from benchmarks.common.results import metadata
from benchmarks.common.timing import load_average, machine_description
from benchmarks.real_text.worker import CT2_DECODINGS, DECODINGS, GENERATE_ONLY, HF_DECODINGS, ROUTES
from hf_vanilla.inference.loading import load_model_and_tokenizer
from hf_vanilla.inference.options import InferenceModelArguments


@dataclass(frozen=True)
class Case:
    mode: str  # generate | cli | cli-start
    route: str
    decoding: str
    batch_size: int

    @property
    def name(self) -> str:
        return f"{self.mode}/{self.route}/{self.decoding}/b{self.batch_size}"


def read_lines(path: Path, limit: int | None = None) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        lines = [line.rstrip("\n") for line in handle]
    return lines[:limit] if limit else lines


def decodings_of(route: str) -> tuple[str, ...]:
    return CT2_DECODINGS if route.startswith("ct2") else HF_DECODINGS


def prepare_folders(model_dir: Path, work_dir: Path, routes: Iterable[str]) -> dict[str, Path]:
    """The model folder of each route's backend: the model itself, CTranslate2 exports (float32, int8)
    and an ONNX export under ``work_dir``, written once and reused."""
    folders = {"hf": model_dir}
    kinds = {ROUTES[route][0] for route in routes}
    for kind in sorted(kinds - {"hf"}):
        folder = work_dir / kind
        folders[kind] = folder
        if folder.exists():
            continue
        if kind.startswith("ct2"):
            from hf_vanilla.interop.export_ctranslate2 import export_ctranslate2

            export_ctranslate2(model_dir, folder, None if kind == "ct2-float32" else "int8")
        else:
            from hf_vanilla.interop.export_onnx import export_onnx

            model, tokenizer = load_model_and_tokenizer(InferenceModelArguments(str(model_dir), device="cpu"))
            export_onnx(model.eval(), tokenizer, folder)
    return folders


def cli_command(case: Case, folder: Path, source: Path, output: Path) -> list[str]:
    decoding = DECODINGS[case.decoding]
    command = [
        shutil.which("hf-vanilla-translate") or "hf-vanilla-translate",
        "--model_name_or_path", str(folder),
        "--input_file", str(source),
        "--output_file", str(output),
        "--overwrite",
        "--device", "cpu",
        "--batch_size", str(case.batch_size),
        "--num_beams", str(decoding.num_beams),
    ]  # fmt: skip
    if decoding.num_beams > 1 and not case.route.startswith("ct2"):
        command += ["--early_stopping", decoding.early_stopping]
    return command + ROUTES[case.route][1]


def bleu(hypotheses: list[str], references: list[str]) -> float:
    return sacrebleu.corpus_bleu(hypotheses, [references[: len(hypotheses)]]).score


class Worker(EngineProcess):
    """A process that loads one generate-mode route (``benchmarks/real_text/worker.py``) and times
    :func:`~hf_vanilla.inference.translation.translate` calls sent to it: one engine per process."""

    def __init__(self, route: str, folder: Path, model_dir: Path, threads: int) -> None:
        command = [
            sys.executable,
            "-m",
            "benchmarks.real_text.worker",
            route,
            str(folder),
            str(model_dir),
            str(threads),
        ]
        super().__init__(command, threads, route)

    def translate(self, sentences: list[str], decoding: str, batch_size: int) -> tuple[float, list[str]]:
        answer = self.request({"sentences": sentences, "decoding": decoding, "batch": batch_size})
        return answer["seconds"], answer["hypotheses"]


def run_case(
    case: Case,
    sentences: list[str],
    workers: dict[str, Worker],
    folders: dict[str, Path],
    work_dir: Path,
    threads: int,
) -> tuple[float, list[str]]:
    """One timed run of ``case``: seconds and the translations."""
    if case.mode == "generate":
        return workers[case.route].translate(sentences, case.decoding, case.batch_size)
    source, output = work_dir / f"source-{len(sentences)}.txt", work_dir / "output.txt"
    if not source.exists():
        source.write_text("".join(f"{line}\n" for line in sentences), encoding="utf-8")
    command = cli_command(case, folders[ROUTES[case.route][0]], source, output)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    return seconds, output.read_text(encoding="utf-8").splitlines()


def select_cases(args: argparse.Namespace) -> list[Case]:
    cases = []
    for mode in args.modes.split(","):
        if mode == "cli-start":
            cases += [
                Case(mode, route, "greedy", 1)
                for route in args.routes.split(",")
                if route not in GENERATE_ONLY
            ]
            continue
        for batch_size in (int(b) for b in args.batch_sizes.split(",")):
            for route in args.routes.split(","):
                if mode == "cli" and route in GENERATE_ONLY:
                    continue  # no command
                cases += [
                    Case(mode, route, decoding, batch_size)
                    for decoding in decodings_of(route)
                    if decoding in args.decodings.split(",")
                    or (decoding == "beam4" and {"never", "true"} & set(args.decodings.split(",")))
                ]
    return cases


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    model_dir, work_dir = Path(args.model_dir), Path(args.work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    cases = select_cases(args)
    routes = sorted({case.route for case in cases})
    folders = prepare_folders(model_dir, work_dir, routes)
    sources = read_lines(Path(args.data_dir) / "val.de.gz", args.sentences)
    references = read_lines(Path(args.data_dir) / "val.en.gz", args.sentences)
    inputs = {
        case: ["Ein Hund rennt."] if case.mode == "cli-start" else
        sources[: args.batch1_sentences] if case.batch_size == 1 else sources
        for case in cases
    }  # fmt: skip
    workers = {
        route: Worker(
            route, folders[ROUTES[route][0]], model_dir, engine_threads(route, args.threads, args.ct2_threads)
        )
        for route in routes
        if any(case.mode == "generate" and case.route == route for case in cases)
    }
    for worker in workers.values():  # warm-up: one batch each, untimed
        worker.translate(sources[:32], "greedy", 32)
    results: dict[str, Any] = {"arguments": vars(args), "machine": machine_description(), "runs": []}
    meta = metadata()
    for round_index in range(args.rounds):
        for case in cases:
            time.sleep(args.settle)  # the last engine's spinning threads wind down
            load = load_average()
            seconds, hypotheses = run_case(
                case,
                inputs[case],
                workers,
                folders,
                work_dir,
                engine_threads(case.route, args.threads, args.ct2_threads),
            )
            words = sum(len(line.split()) for line in inputs[case])
            record = {
                "case": case.name,
                "round": round_index,
                "seconds": seconds,
                "sentences": len(inputs[case]),
                "source_words": words,
                "bleu": bleu(hypotheses, references) if case.mode != "cli-start" else None,
                "load": load,
            }
            results["runs"].append(record)
            if args.json_out:  # after every run: a block cut short by a time limit keeps what it measured
                report = {"meta": meta, **results, "table": table(results["runs"])}
                Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")
            sys.stdout.write(f"{case.name}: {seconds:.2f} s, BLEU {record['bleu']}, load {load:.2f}\n")
            sys.stdout.flush()
    for worker in workers.values():
        worker.close()
    return results


def table(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The comparison's table (:mod:`benchmarks.common.results`): per case, median and min–max seconds
    over all runs, words/s at the median, BLEU (the same in every run of a case unless the route is not
    deterministic: the range is shown then), number of runs, load average range."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        runs.setdefault(record["case"], []).append(record)
    rows = []
    for name, group in sorted(runs.items()):
        seconds = [r["seconds"] for r in group]
        median = statistics.median(seconds)
        scores = sorted({round(r["bleu"], 2) for r in group if r["bleu"] is not None})
        loads = [r["load"] for r in group]
        rows.append(
            [
                name,
                group[0]["sentences"],
                f"{median:.2f}",
                f"{min(seconds):.2f}–{max(seconds):.2f}",
                f"{group[0]['source_words'] / median:.0f}",
                "—" if not scores else " / ".join(f"{s:.2f}" for s in scores),
                len(group),
                f"{min(loads):.1f}–{max(loads):.1f}",
            ]
        )
    return {
        "title": "hf_vanilla's routes against CTranslate2 on real text",
        "columns": ["case", "sentences", "median s", "min–max s", "words/s", "BLEU", "runs", "load"],
        "rows": rows,
        "note": "A case is mode/route/decoding/batch size: `generate` times the decoding loop, `cli` the whole command.",
    }


def summarize(files: list[str], out: Callable[[str], object] = sys.stdout.write) -> None:
    """The Markdown table of one or more JSON results (:func:`table` over all their runs)."""
    records = [record for file in files for record in json.loads(Path(file).read_text())["runs"]]
    rendered = table(records)
    out("| " + " | ".join(rendered["columns"]) + " |\n")
    out("|" + "---|" * len(rendered["columns"]) + "\n")
    for row in rendered["rows"]:
        out("| " + " | ".join(str(value) for value in row) + " |\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_dir", help="The trained model folder (with its tokenizer).")
    parser.add_argument("--data_dir", default="/work/shared/data/multi30k", help="Holds val.{de,en}.gz.")
    parser.add_argument("--work_dir", default="/tmp/real_text", help="Exports and scratch files go here.")
    parser.add_argument("--routes", default=",".join(ROUTES))
    parser.add_argument("--decodings", default=",".join(HF_DECODINGS))
    parser.add_argument("--modes", default="generate,cli,cli-start")
    parser.add_argument("--batch_sizes", default="32,1")
    parser.add_argument("--sentences", type=int, default=None, help="Only the first N sentences (a check).")
    parser.add_argument("--batch1_sentences", type=int, default=100, help="Batch 1: the first N sentences.")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--ct2_threads",
        type=int,
        default=None,
        help=CT2_THREADS_HELP,
    )
    parser.add_argument("--settle", type=float, default=0.5, help="Seconds of pause before each case.")
    parser.add_argument("--json_out", help="Write every run here as JSON.")
    parser.add_argument("--summarize", nargs="+", metavar="JSON", help="Print the table of these results.")
    args = parser.parse_args()
    if args.summarize:
        summarize(args.summarize)
        return
    if not args.model_dir:
        parser.error("--model_dir is required (or --summarize)")
    run(args)


if __name__ == "__main__":
    main()
