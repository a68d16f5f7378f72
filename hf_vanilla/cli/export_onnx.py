"""Write ONNX graphs for cached decoding from an hf_vanilla model folder (needs
`pip install 'hf_vanilla[onnx]'`).

    hf-vanilla-export-onnx --model_dir demo_output --output_dir demo_output_onnx

The output holds `encoder.onnx` (encoder + first decoder step), `decoder_with_past.onnx` (one cached
step), the config, generation config and tokenizer. ONNX Runtime runs them through `generate()` (greedy,
beam search, sampling) with `hf_vanilla.interop.onnx_generation.OnnxVanillaTransformerForConditionalGeneration`,
or greedily with `hf_vanilla.interop.export_onnx.greedy_generate`.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field

from hf_vanilla.cli import parse_arguments, quiet_onnx_exporter, run_cli
from hf_vanilla.interop.options import check_model_dir
from hf_vanilla.io.atomic import OVERWRITE_HELP, refuse_to_replace

logger = logging.getLogger(__name__)


@dataclass
class OnnxExportArguments:
    model_dir: str = field(metadata={"help": "The hf_vanilla model folder (model, config and tokenizer)."})
    output_dir: str = field(metadata={"help": "Where to write the ONNX graphs."})
    overwrite: bool = field(default=False, metadata={"help": OVERWRITE_HELP})


def _run(argv: list[str]) -> None:
    _, (args,) = parse_arguments(argv, OnnxExportArguments, __doc__)
    from hf_vanilla.inference.loading import load_model_and_tokenizer  # torch
    from hf_vanilla.inference.options import InferenceModelArguments
    from hf_vanilla.interop.export_onnx import export_onnx

    check_model_dir(args.model_dir)
    quiet_onnx_exporter()
    refuse_to_replace(args.output_dir, args.overwrite, "--output_dir", inputs=[args.model_dir])
    model, tokenizer = load_model_and_tokenizer(  # a CTranslate2 export: named as one (io.safe_loading)
        InferenceModelArguments(model_name_or_path=args.model_dir, device="cpu", backend="transformers")
    )
    export_onnx(model, tokenizer, args.output_dir, overwrite=args.overwrite)
    logger.info("Exported %s to %s", args.model_dir, args.output_dir)


def main(argv: list[str] | None = None) -> int:
    return run_cli(_run, argv)


if __name__ == "__main__":
    sys.exit(main())
