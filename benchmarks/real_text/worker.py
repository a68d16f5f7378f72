"""One engine of ``benchmarks/real_text/run.py`` in a process of its own (see ``real_text.Worker``).

CTranslate2's and ONNX Runtime's thread pools and torch's slow each other down in one process, so each
route decodes in a worker that imports only its engine: a CTranslate2 route imports no torch (as
``hf-vanilla-translate`` on an export does), a torch route no CTranslate2.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common.engine_process import Message, serve
from hf_vanilla.inference.options import DecodingOptions, InferenceModelArguments
from hf_vanilla.inference.translation import translate

#: Route name → (backend folder kind, ``hf-vanilla-translate`` arguments beyond the folder).
ROUTES: dict[str, tuple[str, list[str]]] = {
    "fp32": ("hf", []),
    "bf16": ("hf", ["--dtype", "bfloat16"]),
    "int8": ("hf", ["--quantization", "dynamic-int8"]),
    "ct2-fp32": ("ct2-float32", []),
    "ct2-int8": ("ct2-int8", []),
    "onnx": ("onnx", []),
    # transformers' own beam-search loop, which goes on computing finished sentences (generate only)
    "fp32-keep": ("hf", []),
    "int8-keep": ("hf", ["--quantization", "dynamic-int8"]),
    # generate() over a model that costs nothing: the fp32 model's outputs replayed (see Replay)
    "replay": ("hf", []),
}
#: Routes without a command of their own.
GENERATE_ONLY = ("onnx", "fp32-keep", "int8-keep", "replay")
#: Decoding name → options. CTranslate2 runs ``beam4`` (its own stopping rule) and ``greedy``.
DECODINGS = {
    "never": DecodingOptions(num_beams=4, early_stopping="never"),
    "true": DecodingOptions(num_beams=4, early_stopping="true"),
    "beam4": DecodingOptions(num_beams=4),
    "greedy": DecodingOptions(num_beams=1),
}
HF_DECODINGS = ("never", "true", "greedy")
CT2_DECODINGS = ("beam4", "greedy")


def load_route(route: str, folder: Path, model_dir: Path, threads: int) -> tuple[Any, Any]:
    """The model and tokenizer a route decodes with, loaded as ``hf-vanilla-translate`` loads them."""
    kind, cli_args = ROUTES[route]
    if kind == "onnx":
        from hf_vanilla.data.tokenization import load_tokenizer
        from hf_vanilla.interop.onnx_generation import OnnxVanillaTransformerForConditionalGeneration

        model = OnnxVanillaTransformerForConditionalGeneration.from_pretrained(
            folder, intra_op_threads=threads
        )
        return model, load_tokenizer(str(model_dir))
    if kind.startswith("ct2"):  # without torch, as hf-vanilla-translate loads an export
        from hf_vanilla.inference.ctranslate2 import load_ctranslate2_and_tokenizer

        return load_ctranslate2_and_tokenizer(InferenceModelArguments(str(folder), device="cpu"))
    import torch

    from hf_vanilla.inference.loading import load_model_and_tokenizer

    torch.set_num_threads(threads)
    options = dict(zip(cli_args[::2], cli_args[1::2], strict=True))
    args = InferenceModelArguments(
        str(folder),
        device="cpu",
        dtype=options.get("--dtype", "auto"),
        quantization=options.get("--quantization", "none"),
    )
    model, tokenizer = load_model_and_tokenizer(args)
    if route.endswith("-keep"):
        model.drop_finished_sentences = False
    return model, tokenizer


class Replay:
    """``generate()`` over a model that costs nothing, to time what ``generate()`` itself costs.

    :meth:`record` translates once (untimed) with the real model and keeps every encoder and decoder
    output in call order; :meth:`replaying` then answers each call with the output recorded for it
    (the decoder's logits, the cache passed in left empty), so the search sees the same scores, takes
    the same steps and returns the same translations, with no arithmetic of the model left: what remains
    is the search, ``generate()``'s own loop and bookkeeping, tokenizing and detokenizing. Decoding the
    same sentences cannot be faster than this through ``generate()``, whatever the model costs."""

    def __init__(self, model: Any) -> None:
        self.model, self.encoder = model, model.get_encoder()
        self.outputs: dict[str, list[Any]] = {"encoder": [], "decoder": []}

    def record(self, run: Callable[[], Any]) -> Any:
        outputs = self.outputs = {"encoder": [], "decoder": []}

        def recorded(forward: Callable[..., Any], kind: str) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                output = forward(*args, **kwargs)
                outputs[kind].append(output.logits.clone() if kind == "decoder" else output)
                return output

            return call

        encoder, decoder = recorded(self.encoder.forward, "encoder"), recorded(self.model.forward, "decoder")
        return self._run_with(encoder, decoder, run)

    def replaying(self, run: Callable[[], Any]) -> Any:
        from transformers.modeling_outputs import Seq2SeqLMOutput

        encoder_outputs, logits = iter(self.outputs["encoder"]), iter(self.outputs["decoder"])

        def decoder(*args: Any, **kwargs: Any) -> Seq2SeqLMOutput:
            return Seq2SeqLMOutput(logits=next(logits), cache=kwargs.get("cache"))

        return self._run_with(lambda *args, **kwargs: next(encoder_outputs), decoder, run)

    def _run_with(
        self, encoder: Callable[..., Any], decoder: Callable[..., Any], run: Callable[[], Any]
    ) -> Any:
        """``run()`` with the encoder's and the model's ``forward`` replaced, then restored as they were."""
        modules = {self.encoder: encoder, self.model: decoder}
        before = {module: module.__dict__.get("forward") for module in modules}
        for module, forward in modules.items():
            module.forward = forward
        try:
            return run()
        finally:
            for module, forward in before.items():
                if forward is None:
                    del module.forward  # the class's own again
                else:
                    module.forward = forward


def main() -> None:
    """``python -m benchmarks.real_text.worker ROUTE FOLDER MODEL_DIR THREADS``: load the route, then time each request
    (sentences, decoding, batch size) and answer with the seconds and the translations."""
    route, folder, model_dir, threads = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])

    def load() -> tuple[Callable[[Message], Message], Message]:
        model, tokenizer = load_route(route, folder, model_dir, threads)
        replay = Replay(model) if route == "replay" else None

        def handle(request: Message) -> Message:
            decoding = DECODINGS[request["decoding"]]

            def run() -> list[str]:
                return translate(model, tokenizer, request["sentences"], decoding, request["batch"], "cpu")

            if replay is not None:
                recorded = replay.record(run)
                start = time.perf_counter()
                out = replay.replaying(run)
                if out != recorded:
                    raise RuntimeError("the replayed search returned other translations than the model's")
            else:
                start = time.perf_counter()
                out = run()
            return {"seconds": time.perf_counter() - start, "hypotheses": list(out)}

        return handle, {"ready": True}

    serve(load)


if __name__ == "__main__":
    main()
