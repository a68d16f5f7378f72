"""How fast the commands start: the wall time of every command's ``--help``, and for
``hf-vanilla-translate`` on a tiny model folder the time from launching the process to the model's first
forward call, beside the floor (``import torch, transformers`` and the modeling code of transformers), and
on its CTranslate2 export (a route that imports no torch) the time to the first call into CTranslate2.

    python -m benchmarks.experiments.cli_startup --rounds 5
    python -m benchmarks.experiments.cli_startup --rounds 3 --python /other/venv/bin/python --label before

Each figure is the median over ``--rounds`` interleaved rounds (every measurement once per round) of a
fresh interpreter's wall time, with min and max, and of its CPU time (user + sys: less sensitive to
other load on a shared machine). ``--python`` picks the interpreter (the hf_vanilla it
imports: a checkout's own virtualenv). The first forward is timed by a forward pre-hook registered
before the command runs (the hook imports torch first, which the command imports anyway).
Name the CPU (``lscpu``) and the load (``uptime``) with the figures: the machine is shared.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = [
    "translate",
    "evaluate_bleu",
    "train",
    "train_tokenizer",
    "average_checkpoints",
    "plot",
    "publish",
    "convert",
    "export_ctranslate2",
    "export_onnx",
    "demo",
    "app",
]

FIRST_FORWARD = """
import sys, time
import torch

def _first(module, args):
    print(f"FIRST_FORWARD {time.time():.6f} {time.process_time():.6f}", file=sys.stderr, flush=True)
    handle.remove()

handle = torch.nn.modules.module.register_module_forward_pre_hook(_first)
from hf_vanilla.cli.translate import main
sys.exit(main(sys.argv[1:]))
"""

FIRST_CT2_CALL = """
import sys, time
from hf_vanilla.inference import ctranslate2

def _first(self, *args, **kwargs):
    print(f"FIRST_FORWARD {time.time():.6f} {time.process_time():.6f}", file=sys.stderr, flush=True)
    return decode(self, *args, **kwargs)

decode = ctranslate2.CTranslate2Model.generate_hypotheses
ctranslate2.CTranslate2Model.generate_hypotheses = _first
from hf_vanilla.cli.translate import main
sys.exit(main(sys.argv[1:]))
"""

EXPORT_CT2 = """
import sys
from hf_vanilla.interop.export_ctranslate2 import export_ctranslate2
export_ctranslate2(sys.argv[1], sys.argv[2])
"""

#: What every model load imports whatever the command: torch, then transformers' modeling code.
FLOORS = ("import torch", "import torch, transformers; import transformers.modeling_utils")

MAKE_FOLDER = """
import sys
from hf_vanilla.data.tokenization import train_bpe_tokenizer
from hf_vanilla.hub.folder import save_model_folder
from hf_vanilla.models.vanilla_transformer.configuration_vanilla_transformer import VanillaTransformerConfig
from hf_vanilla.models.vanilla_transformer.modeling_vanilla_transformer import (
    VanillaTransformerForConditionalGeneration,
)
tokenizer = train_bpe_tokenizer(["one two three four"], vocab_size=300)
config = VanillaTransformerConfig(
    vocab_size=len(tokenizer), d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
    decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
)
save_model_folder(VanillaTransformerForConditionalGeneration(config).eval(), tokenizer, sys.argv[1])
"""


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _wall(command: list[str]) -> tuple[float, float]:
    """Wall and CPU (user + sys) seconds of ``command``, run to its end."""
    start, cpu = time.time(), _cpu()
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.time() - start
    if result.returncode != 0:
        raise SystemExit(f"{command} failed:\n{result.stderr[-2000:]}")
    return seconds, _cpu() - cpu


def _first_forward(
    python: str, folder: Path, source: Path, probe: str = FIRST_FORWARD
) -> tuple[float, float]:
    """Wall seconds from launching ``hf-vanilla-translate`` to the first forward call (``probe``
    ``FIRST_CT2_CALL``: to the first call into CTranslate2), and the CPU seconds (user + sys, all threads)
    the process had used by then."""
    start = time.time()
    args = ["--model_name_or_path", str(folder), "--device", "cpu", "--num_beams", "1"]
    args += ["--input_file", str(source), "--output_file", "-"]
    result = subprocess.run([python, "-c", probe, *args], capture_output=True, text=True, check=False)
    stamps = [line.split()[1:] for line in result.stderr.splitlines() if line.startswith("FIRST_FORWARD")]
    if result.returncode != 0 or not stamps:
        raise SystemExit(f"translate failed:\n{result.stderr[-2000:]}")
    return float(stamps[0][0]) - start, float(stamps[0][1])


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s [{min(values):.2f}–{max(values):.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--python", default=sys.executable, help="The interpreter (and its hf_vanilla).")
    parser.add_argument("--label", default="", help="Name of the column, e.g. before / after.")
    parser.add_argument("--commands", nargs="*", default=COMMANDS, choices=COMMANDS, help="--help of these.")
    args = parser.parse_args()
    times: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder, source = Path(tmp) / "model", Path(tmp) / "in.txt"
        subprocess.run([args.python, "-c", MAKE_FOLDER, str(folder)], check=True, capture_output=True)
        source.write_text("one two\nthree four\n", encoding="utf-8")
        ct2 = subprocess.run(
            [args.python, "-c", EXPORT_CT2, str(folder), str(Path(tmp) / "ct2")], check=False
        )
        ct2_folder = Path(tmp) / "ct2" if ct2.returncode == 0 else None  # without ctranslate2: not measured
        for _ in range(args.rounds):
            times.setdefault("python -c pass", []).append(_wall([args.python, "-c", "pass"]))
            for command in args.commands:
                module = f"hf_vanilla.cli.{command}"
                times.setdefault(f"{command} --help", []).append(_wall([args.python, "-m", module, "--help"]))
            for floor in FLOORS:
                times.setdefault(f"floor: {floor}", []).append(_wall([args.python, "-c", floor]))
            times.setdefault("translate: launch → first forward", []).append(
                _first_forward(args.python, folder, source)
            )
            if ct2_folder is not None:
                times.setdefault("translate, CTranslate2 export: launch → first call", []).append(
                    _first_forward(args.python, ct2_folder, source, FIRST_CT2_CALL)
                )
    print(
        f"| {args.label or 'measurement'} ({args.rounds} rounds) | wall: median [min–max] | CPU (user + sys) |"
    )
    print("|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {_cell([wall for wall, _ in values])} | {_cell([cpu for _, cpu in values])} |")


if __name__ == "__main__":
    main()
