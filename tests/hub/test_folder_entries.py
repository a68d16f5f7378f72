"""A folder's ``auto_map`` and ``custom_pipelines`` have one home, the model's saving file: what a plain
``save_pretrained`` writes is what hf_vanilla's folder check expects."""

from __future__ import annotations

import json
from pathlib import Path

from hf_vanilla.hub import folder
from hf_vanilla.models.vanilla_transformer import saving_vanilla_transformer as saving
from hf_vanilla.models.vanilla_transformer.modeling_vanilla_transformer import VanillaTransformerModel
from tests.helpers import tiny_config, tiny_model


def test_save_pretrained_writes_the_entries_the_folder_check_expects(tmp_path: Path) -> None:
    tiny_model().save_pretrained(tmp_path / "generating")
    VanillaTransformerModel(tiny_config()).save_pretrained(tmp_path / "base")
    generating = json.loads((tmp_path / "generating" / "config.json").read_text())
    base = json.loads((tmp_path / "base" / "config.json").read_text())
    assert generating["auto_map"] == base["auto_map"] == saving.folder_auto_map() == folder.AUTO_MAP
    assert generating["custom_pipelines"] == saving.folder_custom_pipelines() == folder.CUSTOM_PIPELINES
    assert "custom_pipelines" not in base
    assert folder.AUTO_MAP == {
        "AutoConfig": "configuration_vanilla_transformer.VanillaTransformerConfig",
        "AutoModel": "modeling_vanilla_transformer.VanillaTransformerModel",
        "AutoModelForSeq2SeqLM": "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration",
    }
    assert folder.CUSTOM_PIPELINES == {
        "vanilla-translation": {
            "impl": "pipeline_vanilla_transformer.VanillaTranslationPipeline",
            "pt": ["AutoModelForSeq2SeqLM"],
            "type": "text",
        }
    }
