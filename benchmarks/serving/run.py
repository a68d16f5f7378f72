"""Load on hf-vanilla-serve: N clients × M requests on loopback, batched against one request at a time,
the transformers backend against CTranslate2.

A random model (``--d_model``, ``--layers``; the embedding row of ``</s>`` is zero, so no translation ends
early and every request decodes exactly ``--new_tokens`` tokens) is saved with a word-level tokenizer and
exported to CTranslate2. For each backend and each batching setting, a real server process
(``hf_vanilla.cli.serve``, ``OMP_NUM_THREADS=--threads``) is started on a free loopback port;
``--clients`` threads each send ``--requests`` requests of ``--texts`` random sentences (8 to 24 words)
one after the other, and the run stops when all are answered. "batched" is the server's default
(``--max_batch_tokens 4096 --max_wait_ms 5``); "one at a time" is ``--max_batch_tokens 1 --max_wait_ms 0``
(each request alone). Each row: requests/s and sentences/s over the whole run, p50/p95/p99 latency of a
request, the batches the server formed and the machine's load average during the setting. The table goes
to stdout; ``--json_out`` writes the report as the suite's JSON (:mod:`benchmarks.common.results`).

    python -m benchmarks.serving.run --json_out serving.json        # 8 clients × 8 requests, 4 settings
    python -m benchmarks.serving.run --clients 2 --requests 2 --new_tokens 4   # plumbing check
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import HfArgumentParser, PreTrainedTokenizerFast

from benchmarks.common.results import metadata, render_run
from hf_vanilla.hub.folder import save_model_folder
from hf_vanilla.interop.export_ctranslate2 import export_ctranslate2
from hf_vanilla.models.vanilla_transformer.configuration_vanilla_transformer import VanillaTransformerConfig
from hf_vanilla.models.vanilla_transformer.modeling_vanilla_transformer import (
    VanillaTransformerForConditionalGeneration,
)

ROOT = Path(__file__).resolve().parents[2]
WORDS = 2000
SETTINGS = {"batched": [], "one at a time": ["--max_batch_tokens", "1", "--max_wait_ms", "0"]}


@dataclass
class LoadArguments:
    clients: int = field(default=8, metadata={"help": "Clients sending at the same time."})
    requests: int = field(default=8, metadata={"help": "Requests per client, one after the other."})
    texts: int = field(default=2, metadata={"help": "Sentences per request."})
    new_tokens: int = field(default=16, metadata={"help": "Tokens decoded per sentence (greedy)."})
    d_model: int = field(default=256, metadata={"help": "Model width (heads: d_model / 64)."})
    layers: int = field(default=3, metadata={"help": "Encoder and decoder layers each."})
    threads: int = field(default=1, metadata={"help": "OMP_NUM_THREADS of the server process."})
    json_out: str | None = field(default=None, metadata={"help": "Also write the report here as JSON."})


def build_folder(args: LoadArguments, folder: Path) -> None:
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{f"w{i}": i + 4 for i in range(WORDS)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    config = VanillaTransformerConfig(
        vocab_size=len(vocab),
        d_model=args.d_model,
        encoder_layers=args.layers,
        decoder_layers=args.layers,
        encoder_attention_heads=max(1, args.d_model // 64),
        decoder_attention_heads=max(1, args.d_model // 64),
        encoder_ffn_dim=4 * args.d_model,
        decoder_ffn_dim=4 * args.d_model,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight[config.eos_token_id].zero_()
    save_model_folder(model, tokenizer, folder)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def run_setting(
    args: LoadArguments, folder: Path, flags: list[str], bodies: list[list[dict[str, Any]]]
) -> dict[str, Any]:
    """Start a server on ``folder`` with ``flags``, send every client's bodies, stop it; the figures."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(args.threads)}
    command = [sys.executable, str(ROOT / "scripts" / "serve.py"), "--model_dir", str(folder), "--device", "cpu",
               "--port", str(port), "--num_beams", "1", "--max_queue", str(args.clients + 1), *flags]  # fmt: skip
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not start: {server.stderr.read()[-2000:]}") from None
                time.sleep(0.2)
        httpx.post(f"{url}/translate", json=bodies[0][0], timeout=300).raise_for_status()  # warm-up
        before = httpx.get(f"{url}/health").json()
        load_before = os.getloadavg()[0]
        latencies: list[float] = []
        failures: list[str] = []

        def client(own: list[dict[str, Any]]) -> None:
            with httpx.Client(timeout=600) as session:
                for body in own:
                    sent = time.perf_counter()
                    reply = session.post(f"{url}/translate", json=body)
                    latencies.append(time.perf_counter() - sent)
                    if reply.status_code != 200:
                        failures.append(reply.text)

        threads = [threading.Thread(target=client, args=(own,)) for own in bodies]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
        after = httpx.get(f"{url}/health").json()
    finally:
        server.terminate()
        server.wait(120)
    if failures:
        raise RuntimeError(f"{len(failures)} request(s) failed, e.g. {failures[0]}")
    requests = len(latencies)
    return {
        "requests": requests,
        "seconds": round(elapsed, 3),
        "requests_per_s": round(requests / elapsed, 2),
        "sentences_per_s": round(requests * args.texts / elapsed, 2),
        "tokens_per_s": round(requests * args.texts * args.new_tokens / elapsed, 1),
        "p50_ms": round(1000 * percentile(latencies, 50), 1),
        "p95_ms": round(1000 * percentile(latencies, 95), 1),
        "p99_ms": round(1000 * percentile(latencies, 99), 1),
        "mean_ms": round(1000 * statistics.fmean(latencies), 1),
        "batches": after["batches"] - before["batches"],
        "load": [round(load_before, 1), round(os.getloadavg()[0], 1)],
    }


def table(report: dict[str, Any]) -> dict[str, Any]:
    """The comparison's table for benchmarks/RESULTS.md (:mod:`benchmarks.common.results`): throughput and
    latency of each backend and batching setting, with the load average around it."""
    args, cpus = report["arguments"], report["meta"]["machine"]["logical_cpus"]
    rows = [
        [
            row["backend"],
            row["setting"],
            row["requests_per_s"],
            row["sentences_per_s"],
            row["p50_ms"],
            row["p95_ms"],
            row["p99_ms"],
            row["batches"],
            "–".join(f"{load:.1f}" for load in row["load"]),
        ]
        for row in report["rows"]
    ]
    loaded = max(max(row["load"]) for row in report["rows"]) > cpus
    return {
        "title": (
            f"hf-vanilla-serve under load: {args['clients']} clients × {args['requests']} requests of "
            f"{args['texts']} sentences, d_model {args['d_model']}, {args['layers']} + {args['layers']} layers"
        ),
        "columns": [
            "backend",
            "setting",
            "requests/s",
            "sentences/s",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "batches",
            "load",
        ],
        "rows": rows,
        "note": (
            f"A random model, greedy, {args['new_tokens']} tokens per sentence; the server on {args['threads']} "
            f'thread(s) (`OMP_NUM_THREADS`). "batched" is the server\'s default, "one at a time" is '
            "`--max_batch_tokens 1 --max_wait_ms 0`; latencies are per request; batches: those the server formed; "
            f"load: the 1-minute load average before and after the setting (the run's own server and clients "
            f"included), on {cpus} logical CPUs."
            + (" A shared machine under load: the figures are rough." if loaded else "")
        ),
    }


def main(argv: list[str] | None = None) -> int:
    (args,) = HfArgumentParser(LoadArguments).parse_args_into_dataclasses(args=argv)
    generator = torch.Generator().manual_seed(1)

    def sentence() -> str:
        words = int(torch.randint(8, 25, (1,), generator=generator))
        return " ".join(f"w{int(i)}" for i in torch.randint(0, WORDS, (words,), generator=generator))

    bodies = [
        [
            {"texts": [sentence() for _ in range(args.texts)], "max_length": args.new_tokens}
            for _ in range(args.requests)
        ]
        for _ in range(args.clients)
    ]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        build_folder(args, folder)
        folders = {"transformers": folder, "ctranslate2": Path(export_ctranslate2(folder, Path(tmp) / "ct2"))}
        for backend, path in folders.items():
            for setting, flags in SETTINGS.items():
                row = {"backend": backend, "setting": setting, **run_setting(args, path, flags, bodies)}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    report = {"meta": metadata(argv), "arguments": asdict(args), "rows": rows}
    report["table"] = table(report)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(render_run(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
