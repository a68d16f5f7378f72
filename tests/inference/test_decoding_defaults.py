"""The paper's decoding defaults (§6.1) have one home, the model's generation file: the model's
generation config, the commands' defaults and their log line all read it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT

GENERATION = Path("hf_vanilla/models/vanilla_transformer/generation_vanilla_transformer.py")
PAPER = '{"num_beams": 4, "length_penalty": 0.6, "early_stopping": "never", "max_length_offset": 50}'
OTHER = '{"num_beams": 3, "length_penalty": 0.7, "early_stopping": True, "max_length_offset": 9}'

READ = """
import json, sys
from hf_vanilla.inference.options import DecodingOptions
from hf_vanilla.models.vanilla_transformer.configuration_vanilla_transformer import VanillaTransformerConfig
from hf_vanilla.models.vanilla_transformer.modeling_vanilla_transformer import (
    VanillaTransformerForConditionalGeneration,
)
options = DecodingOptions()
config = VanillaTransformerConfig(d_model=8, encoder_layers=1, decoder_layers=1, encoder_attention_heads=1,
    decoder_attention_heads=1, encoder_ffn_dim=8, decoder_ffn_dim=8, vocab_size=8)
generation = VanillaTransformerForConditionalGeneration(config).generation_config
print(json.dumps({"options": [options.num_beams, options.length_penalty, options.early_stopping],
    "log": options.describe(),
    "generation": [generation.num_beams, generation.length_penalty, generation.early_stopping,
                   generation.max_length_offset]}))
"""


def test_the_decoding_defaults_are_read_from_the_generation_file(tmp_path: Path) -> None:
    """Changing ``PAPER_DECODING`` in the generation file changes the model's generation config, the
    ``DecodingOptions`` defaults the commands offer and the length bound their log line names."""
    source = (ROOT / GENERATION).read_text(encoding="utf-8")
    assert f"PAPER_DECODING = {PAPER}" in source
    shutil.copytree(
        ROOT / "hf_vanilla", tmp_path / "hf_vanilla", ignore=shutil.ignore_patterns("__pycache__")
    )
    (tmp_path / GENERATION).write_text(source.replace(PAPER, OTHER), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", READ], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    read = json.loads(done.stdout.strip().splitlines()[-1])
    assert read["generation"] == [3, 0.7, True, 9]
    assert read["options"] == [3, 0.7, "true"]
    assert "max output length = input length + 9," in read["log"] and read["log"].startswith("beam 3,")
