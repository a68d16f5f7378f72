"""An export of hf_vanilla's is recognised in one place (io), by the loader's refusal and by
``--backend auto`` alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from hf_vanilla.inference.ctranslate2 import resolve_backend
from hf_vanilla.inference.options import InferenceModelArguments
from hf_vanilla.io.errors import CheckpointError
from hf_vanilla.io.manifest import export_kind, is_ctranslate2_folder
from hf_vanilla.io.safe_loading import verify_model_folder


def _folder(tmp_path: Path, name: str, *files: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "transformer"}')
    for file in files:
        (folder / file).write_bytes(b"x")
    return folder


def test_the_loader_and_the_backend_choice_agree_on_what_an_export_is(tmp_path: Path) -> None:
    ct2 = _folder(tmp_path, "ct2", "model.bin")
    onnx = _folder(tmp_path, "onnx", "encoder_model.onnx")
    plain = _folder(tmp_path, "plain")
    both = _folder(tmp_path, "both", "model.bin", "model.safetensors")
    assert [is_ctranslate2_folder(folder) for folder in (ct2, onnx, plain, both)] == [
        True,
        False,
        False,
        False,
    ]
    assert export_kind(ct2)[0] == "a CTranslate2 export (model.bin)"
    assert export_kind(onnx)[0] == "an ONNX export (*.onnx)"
    assert export_kind(plain) is None and export_kind(both) is None
    for folder, backend in ((ct2, "ctranslate2"), (plain, "transformers"), (both, "transformers")):
        assert resolve_backend(InferenceModelArguments(model_name_or_path=str(folder))) == backend
    with pytest.raises(CheckpointError, match=r"is a CTranslate2 export \(model\.bin\), not a transformers"):
        verify_model_folder(ct2)
    with pytest.raises(CheckpointError, match="is an ONNX export"):
        verify_model_folder(onnx)
