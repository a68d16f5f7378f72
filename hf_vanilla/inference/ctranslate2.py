"""Translating with a CTranslate2 folder (the ``ctranslate2`` backend)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from hf_vanilla.inference.decoding import DecodingOptions, check_nbest

__all__ = ["CTranslate2Model"]


class CTranslate2Model:
    """A CTranslate2 model folder (written by :func:`hf_vanilla.interop.export_ctranslate2.export_ctranslate2`) run
    by ``ctranslate2.Translator``, decoded by :func:`translate` with the same tokenizer and output as the
    transformers backend.

    Decoding differs from ``generate()`` where CTranslate2 has no equivalent: beam search uses
    CTranslate2's own stopping rule (``early_stopping`` is not applied), ``length_penalty_type="gnmt"``
    is refused, and the per-sentence bound of input length + ``max_length_offset`` (50) tokens (``</s>``
    included) is applied by decoding the batch to its longest bound and cutting each output at its own
    (exact for greedy decoding). Scores (``nbest``) are CTranslate2's: the log-probability divided by |Y|^α in beam
    search, the plain log-probability in greedy decoding.
    """

    def __init__(self, folder: str | Path, device: torch.device, dtype: str = "auto") -> None:
        try:
            import ctranslate2
        except ImportError as err:
            raise ImportError(
                "--backend ctranslate2 needs CTranslate2: pip install 'hf_vanilla[ct2]' (or pip install ctranslate2)."
            ) from err
        folder = Path(folder)
        if not (folder / "model.bin").is_file():
            raise FileNotFoundError(
                f"--model_name_or_path {str(folder)!r} holds no CTranslate2 model (model.bin): write one with "
                "hf-vanilla-export-ct2, or use --backend transformers."
            )
        compute_type = "default" if dtype == "auto" else dtype
        supported = ctranslate2.get_supported_compute_types(device.type, device.index or 0)
        if compute_type != "default" and compute_type not in supported:
            raise ValueError(
                f"--dtype {dtype}: CTranslate2 cannot compute in it on {device.type} (it can: "
                f"{', '.join(sorted(supported))}); use --dtype auto or float32."
            )
        self.folder = folder
        generation = folder / "generation_config.json"
        defaults = json.loads(generation.read_text(encoding="utf-8")) if generation.is_file() else {}
        self.max_length_offset = int(defaults.get("max_length_offset", 50))
        self.config = self._vocabulary_config(folder, defaults)
        try:
            self.translator = ctranslate2.Translator(
                str(folder), device=device.type, device_index=device.index or 0, compute_type=compute_type
            )
        except RuntimeError as err:  # CTranslate2 names neither the file nor what to do
            raise ValueError(
                f"{folder / 'model.bin'}: CTranslate2 cannot load it ({str(err).splitlines()[0] if str(err) else err!r}); "
                "if it is damaged or incomplete, export it again with hf-vanilla-export-ct2."
            ) from err

    @staticmethod
    def _vocabulary_config(folder: Path, defaults: dict[str, Any]) -> SimpleNamespace:
        """What :func:`hf_vanilla.data.tokenization.check_tokenizer_matches_config` compares, read from the
        export: the vocabulary sizes (one row per token string) and the special-token ids of the model it
        was exported from (its generation config; without one, the positions of CTranslate2's own
        ``bos_token`` and ``eos_token``, and the pad id is not checked)."""
        shared = folder / "shared_vocabulary.json"
        if shared.is_file():
            source = target = json.loads(shared.read_text(encoding="utf-8"))
        else:
            source, target = (
                json.loads((folder / f"{side}_vocabulary.json").read_text(encoding="utf-8"))
                for side in ("source", "target")
            )
        ct2_config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        ids = {
            f"{name}_token_id": defaults.get(
                f"{name}_token_id", target.index(token) if token in target else None
            )
            for name, token in (("bos", ct2_config.get("bos_token")), ("eos", ct2_config.get("eos_token")))
        }
        if "pad_token_id" in defaults:
            ids["pad_token_id"] = defaults["pad_token_id"]
        sizes = {"vocab_size": len(source), "decoder_vocab_size": None if shared.is_file() else len(target)}
        return SimpleNamespace(**sizes, **ids)

    def describe(self, options: DecodingOptions) -> str:
        """What CTranslate2 does with ``options``, for the log (:meth:`DecodingOptions.describe` names
        transformers' beam search)."""
        if options.num_beams == 1:
            search = "greedy (beam 1)"
        else:
            search = (
                f"beam {options.num_beams}, length penalty |Y|^{options.length_penalty}, stopping when "
                f"{options.num_beams} hypotheses have finished (patience 1; --early_stopping is not used)"
            )
        return f"CTranslate2 {search}, max output length = input length + {self.max_length_offset}"

    def generate_hypotheses(
        self,
        tokenizer: Any,
        input_ids: list[list[int]],
        options: DecodingOptions,
        nbest: int | None = None,
        max_new_tokens: int | None = None,
    ) -> list[list[tuple[list[int], float | None]]]:
        """What :func:`generate_hypotheses` returns, for unpadded ``input_ids``."""
        if options.length_penalty_type == "gnmt":
            raise ValueError("--length_penalty_type gnmt needs the transformers backend (n-best rescoring).")
        check_nbest(nbest, options.num_beams)
        # generate() ends each sentence with </s> at its input length + offset: that many tokens minus one
        bounds = [len(ids) + self.max_length_offset - 1 for ids in input_ids]
        longest = max(bounds) if max_new_tokens is None else min(max(bounds), max_new_tokens)
        results = self.translator.translate_batch(
            [tokenizer.convert_ids_to_tokens(ids) for ids in input_ids],
            beam_size=options.num_beams,
            length_penalty=options.length_penalty,
            num_hypotheses=nbest or 1,
            return_scores=nbest is not None,
            max_decoding_length=longest,
            min_decoding_length=0,  # CTranslate2's default 1 forbids the empty translation generate() allows
            max_input_length=0,  # lengths are checked before, with a message naming the line
        )
        return [
            [
                (tokenizer.convert_tokens_to_ids(tokens)[:bound], result.scores[k] if nbest else None)
                for k, tokens in enumerate(result.hypotheses)
            ]
            for result, bound in zip(results, bounds, strict=True)
        ]
