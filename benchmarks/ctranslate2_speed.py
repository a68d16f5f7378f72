"""CTranslate2 against hf_vanilla's own ``generate()`` on CPU: the same model, exported (issue 6).

A base model (Table 3: N = 6, d_model = 512, h = 8, d_ff = 2048) with random weights and a shared
vocabulary of ``--vocab_size`` word tokens is saved with a word-level tokenizer, exported with
``hf_vanilla.export_ctranslate2`` (float32, and int8 if asked), and both translate the same batch of
random source sentences with beam search. Random weights rarely emit ``</s>``, so both are forced to
decode exactly ``--new_tokens`` tokens (``min_new_tokens``/``min_decoding_length``) and do the same
amount of work. Both use ``--threads`` CPU threads. Runs alternate (HF, CT2, HF, CT2, …) after one
warm-up each; the report gives the median wall time per batch and the median of the per-pair ratios.

    python benchmarks/ctranslate2_speed.py                  # beam 4, batch 32, 2 threads
    python benchmarks/ctranslate2_speed.py --quantization int8 --repeats 7
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import ctranslate2
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import HfArgumentParser, PreTrainedTokenizerFast

from hf_vanilla import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla.export_ctranslate2 import export_ctranslate2


@dataclass
class SpeedArguments:
    batch_size: int = field(default=32, metadata={"help": "Sentences per batch."})
    num_beams: int = field(default=4, metadata={"help": "Beam size (§6.1: 4)."})
    new_tokens: int = field(default=32, metadata={"help": "Tokens decoded per sentence (forced)."})
    source_length: int = field(default=24, metadata={"help": "Mean source length in tokens (±50%)."})
    vocab_size: int = field(default=8000, metadata={"help": "Shared vocabulary size."})
    threads: int = field(default=2, metadata={"help": "CPU threads for both engines."})
    repeats: int = field(default=5, metadata={"help": "Timed runs per engine."})
    quantization: str | None = field(
        default=None, metadata={"help": "Also time CTranslate2 with this weight type (e.g. int8)."}
    )
    output_json: str | None = field(default=None, metadata={"help": "Write the results here as JSON."})


def word_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{f"w{i}": i + 4 for i in range(vocab_size - 4)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def main() -> None:
    (args,) = HfArgumentParser(SpeedArguments).parse_args_into_dataclasses()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    folder = Path(tempfile.mkdtemp(prefix="ct2-speed-"))
    tokenizer = word_tokenizer(args.vocab_size)
    model = VanillaTransformerForConditionalGeneration(
        VanillaTransformerConfig.from_preset("base", vocab_size=args.vocab_size)
    ).eval()
    model.save_pretrained(folder / "hf")
    tokenizer.save_pretrained(folder / "hf")

    generator = torch.Generator().manual_seed(1)
    low, high = args.source_length // 2, args.source_length * 3 // 2
    lengths = torch.randint(low, high + 1, (args.batch_size,), generator=generator).tolist()
    texts = [
        " ".join(f"w{int(i)}" for i in torch.randint(0, args.vocab_size - 4, (n,), generator=generator))
        for n in lengths
    ]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    tokens = [tokenizer.convert_ids_to_tokens(tokenizer(text).input_ids) for text in texts]

    def run_hf() -> None:
        with torch.inference_mode():
            model.generate(
                **batch,
                num_beams=args.num_beams,
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                do_sample=False,
            )

    engines = {"hf_generate": run_hf}
    for quantization in [None, args.quantization] if args.quantization else [None]:
        name = f"ct2_{quantization or 'float32'}"
        export_ctranslate2(folder / "hf", folder / name, quantization=quantization)
        translator = ctranslate2.Translator(
            str(folder / name), device="cpu", intra_threads=args.threads, inter_threads=1
        )

        def run_ct2(translator: ctranslate2.Translator = translator) -> None:
            translator.translate_batch(
                tokens,
                beam_size=args.num_beams,
                max_batch_size=args.batch_size,
                max_decoding_length=args.new_tokens,
                min_decoding_length=args.new_tokens,
            )

        engines[name] = run_ct2

    times: dict[str, list[float]] = {name: [] for name in engines}
    for run in engines.values():  # warm-up
        run()
    for _ in range(args.repeats):
        for name, run in engines.items():
            start = time.perf_counter()
            run()
            times[name].append(1000 * (time.perf_counter() - start))

    result = {"arguments": asdict(args), "load_average": os.getloadavg()[0], "median_ms": {}, "speedup": {}}
    for name, values in times.items():
        result["median_ms"][name] = round(statistics.median(values), 1)
        if name != "hf_generate":
            ratios = [hf / ct2 for hf, ct2 in zip(times["hf_generate"], values, strict=True)]
            result["speedup"][name] = round(statistics.median(ratios), 2)
    text = json.dumps(result, indent=2)
    print(text)
    if args.output_json:
        Path(args.output_json).write_text(text + "\n")


if __name__ == "__main__":
    main()
