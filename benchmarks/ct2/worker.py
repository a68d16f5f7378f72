"""One engine of ``benchmarks/ct2/run.py`` in a process of its own (see :mod:`engine_process`).

``python -m benchmarks.ct2.worker ENGINE FOLDER THREADS``: ``ENGINE`` is ``"hf ROUTE"`` (a route of
:mod:`hf_vanilla.inference.quantization`, loaded from ``FOLDER/hf``) or ``"ct2 float32"`` /
``"ct2 int8"`` (``FOLDER/ct2-TYPE``, exported by benchmarks.ct2.run). A CTranslate2 worker imports no torch, a
torch worker no CTranslate2. Requests: ``{"ids": …, "tokens": …, "beams": …, "new_tokens": …}`` makes
the decoding call of a case, ``{"time": true}`` runs it once and answers with its seconds. Every call
raises unless each sentence got exactly ``new_tokens`` tokens.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common.engine_process import Message, serve


def folder_megabytes(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def load_engine(name: str, folder: Path, threads: int) -> tuple[Any, float]:
    """The engine and its weights' size on disk in MB."""
    kind, variant = name.split(" ", 1)
    if kind == "ct2":
        import ctranslate2

        target = folder / f"ct2-{variant}"
        translator = ctranslate2.Translator(
            str(target), device="cpu", compute_type=variant, intra_threads=threads, inter_threads=1
        )
        return translator, folder_megabytes(target)
    import torch
    from transformers import AutoModelForSeq2SeqLM

    from hf_vanilla.inference.quantization import from_pretrained_kwargs, quantize_loaded

    torch.set_num_threads(threads)
    if variant == "none":
        return AutoModelForSeq2SeqLM.from_pretrained(folder / "hf").eval(), folder_megabytes(folder / "hf")
    if variant == "dynamic-int8":
        model = quantize_loaded(AutoModelForSeq2SeqLM.from_pretrained(folder / "hf").eval(), variant)
        saved = folder / "dynamic-int8.pt"
        torch.save(model.state_dict(), saved)
        return model, saved.stat().st_size / 2**20
    model = AutoModelForSeq2SeqLM.from_pretrained(folder / "hf", **from_pretrained_kwargs(variant)).eval()
    model.save_pretrained(folder / variant)
    return model, folder_megabytes(folder / variant)


def make_call(engine: Any, request: Message) -> Callable[[], object]:
    """One decoding of the case's batch."""
    beams, new_tokens = request["beams"], request["new_tokens"]
    if type(engine).__module__.startswith("ctranslate2"):
        tokens = request["tokens"]

        def run() -> object:
            results = engine.translate_batch(
                tokens, beam_size=beams, max_batch_size=len(tokens), max_decoding_length=new_tokens
            )
            lengths = {len(result.hypotheses[0]) for result in results}
            if lengths != {new_tokens}:
                raise RuntimeError(
                    f"Expected {new_tokens} tokens from CTranslate2, got lengths {sorted(lengths)}."
                )
            return results

        return run
    import torch

    from benchmarks.common.workloads import generation_config, make_generate

    return make_generate(
        engine, torch.tensor(request["ids"]), generation_config(beams, new_tokens), new_tokens
    )


def main() -> None:
    name, folder, threads = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])

    def load() -> tuple[Callable[[Message], Message], Message]:
        engine, size_mb = load_engine(name, folder, threads)
        call: list[Callable[[], object]] = []

        def handle(request: Message) -> Message:
            if "time" not in request:
                call[:] = [make_call(engine, request)]
                return {"ready": True}
            gc.collect()
            start = time.perf_counter()
            call[0]()
            return {"seconds": time.perf_counter() - start}

        return handle, {"size_mb": size_mb}

    serve(load)


if __name__ == "__main__":
    main()
