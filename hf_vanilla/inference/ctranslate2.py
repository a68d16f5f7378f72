"""Translating with a CTranslate2 folder (the ``ctranslate2`` backend). Nothing here imports torch, so a
command that translates with a CTranslate2 export starts in about a second."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from hf_vanilla.inference.options import (
    BACKENDS,
    DTYPE_NAMES,
    DecodingOptions,
    InferenceModelArguments,
    check_nbest,
)
from hf_vanilla.io.checksums import verify_checksums
from hf_vanilla.io.json_files import read_json
from hf_vanilla.io.manifest import CTRANSLATE2_ALIGNMENT, CTRANSLATE2_WEIGHTS, is_ctranslate2_folder
from hf_vanilla.models import paper_decoding

if TYPE_CHECKING:
    import torch

__all__ = ["CTranslate2Model", "is_ctranslate2_folder", "load_ctranslate2_and_tokenizer", "resolve_backend"]

#: What to do about a damaged file of an export.
_EXPORT_AGAIN = "Export the model again with hf-vanilla-export-ct2."


def resolve_backend(args: InferenceModelArguments) -> str:
    """``--backend``, with ``auto`` resolved by what the model folder holds."""
    if args.backend not in BACKENDS:
        raise ValueError(f"Unknown --backend {args.backend!r}: choose one of {', '.join(BACKENDS)}.")
    if args.backend != "auto":
        return args.backend
    return "ctranslate2" if is_ctranslate2_folder(args.model_name_or_path) else "transformers"


def load_ctranslate2_and_tokenizer(args: InferenceModelArguments) -> tuple[CTranslate2Model, Any]:
    """The ``ctranslate2`` backend's half of :func:`hf_vanilla.inference.loading.load_model_and_tokenizer`,
    without torch: the export as a :class:`CTranslate2Model` and its tokenizer, checked to belong together."""
    from hf_vanilla.data.tokenization import check_tokenizer_matches_config, load_tokenizer

    if args.quantization != "none":
        raise ValueError(
            "--quantization is for the transformers backend; a CTranslate2 model is quantized when exported "
            "(hf-vanilla-export-ct2 --quantization int8)."
        )
    if args.dtype not in DTYPE_NAMES:
        raise ValueError(f"Unknown --dtype {args.dtype!r}: choose one of {', '.join(DTYPE_NAMES)}.")
    tokenizer_source = args.tokenizer_name_or_path or args.model_name_or_path
    tokenizer = load_tokenizer(tokenizer_source, trust_remote_code=args.trust_remote_code)
    model = CTranslate2Model(args.model_name_or_path, args.device, args.dtype)
    check_tokenizer_matches_config(
        tokenizer, model.config, f"tokenizer {tokenizer_source}, model {args.model_name_or_path}"
    )
    return model, tokenizer


def _device(ctranslate2: Any, device: str | torch.device | None) -> tuple[str, int]:
    """``--device`` for CTranslate2 (its own view of the GPUs, no torch): ``None``/``"auto"`` → CUDA if
    CTranslate2 sees a GPU, else CPU; ``"cpu"``, ``"cuda"`` and ``"cuda:N"`` as named."""
    name = "auto" if device is None else str(device)
    gpus = ctranslate2.get_cuda_device_count()
    if name == "auto":
        return ("cuda" if gpus else "cpu"), 0
    kind, _, index = name.partition(":")
    if kind not in ("cpu", "cuda") or (index and not index.isdigit()):
        raise ValueError(f"--device {name!r}: CTranslate2 runs on 'cpu', 'cuda' or 'cuda:N' (or use 'auto').")
    if kind == "cuda" and not gpus:
        raise ValueError("`device` is 'cuda' but no CUDA GPU is visible: use --device cpu.")
    return kind, int(index or 0)


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

    def __init__(
        self, folder: str | Path, device: str | torch.device | None = None, dtype: str = "auto"
    ) -> None:
        try:
            import ctranslate2
        except ImportError as err:
            raise ImportError(
                "--backend ctranslate2 needs CTranslate2: pip install 'hf_vanilla[ct2]' (or pip install ctranslate2)."
            ) from err
        folder = Path(folder)
        if not (folder / CTRANSLATE2_WEIGHTS).is_file():
            raise FileNotFoundError(
                f"--model_name_or_path {str(folder)!r} holds no CTranslate2 model (model.bin): write one with "
                "hf-vanilla-export-ct2, or use --backend transformers."
            )
        device_type, device_index = _device(ctranslate2, device)
        compute_type = "default" if dtype == "auto" else dtype
        supported = ctranslate2.get_supported_compute_types(device_type, device_index)
        if compute_type != "default" and compute_type not in supported:
            raise ValueError(
                f"--dtype {dtype}: CTranslate2 cannot compute in it on {device_type} (it can: "
                f"{', '.join(sorted(supported))}); use --dtype auto or float32."
            )
        verify_checksums(folder)  # the manifest the export wrote: weights, vocabularies, tokenizer
        self.folder = folder
        generation = folder / "generation_config.json"
        defaults = read_json(generation, hint=_EXPORT_AGAIN) if generation.is_file() else {}
        self.max_length_offset = int(defaults.get("max_length_offset", paper_decoding()["max_length_offset"]))
        self.config = self._vocabulary_config(folder, defaults)
        ct2_config = read_json(folder / "config.json", hint=_EXPORT_AGAIN)
        #: Whether CTranslate2's attention is the one alignments are read from (see :meth:`hard_alignments`).
        self.attention_aligns = all(
            ct2_config.get(key) == value for key, value in CTRANSLATE2_ALIGNMENT.items()
        )
        self._translator_args = {
            "device": device_type,
            "device_index": device_index,
            "compute_type": compute_type,
        }
        self._sampled = False  # whether the translator's random generators have been used
        try:
            self.translator = ctranslate2.Translator(str(folder), **self._translator_args)
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
            source = target = read_json(shared, list, _EXPORT_AGAIN)
        else:
            source, target = (
                read_json(folder / f"{side}_vocabulary.json", list, _EXPORT_AGAIN)
                for side in ("source", "target")
            )
        ct2_config = read_json(folder / "config.json", hint=_EXPORT_AGAIN)
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
        if options.do_sample:
            search = (
                f"sampling (top-k {options.top_k or 'all'}, top-p {options.top_p}, temperature "
                f"{options.temperature}, seed {options.seed})"
            )
        elif options.num_beams == 1:
            search = "greedy (beam 1)"
        else:
            search = (
                f"beam {options.num_beams}, length penalty |Y|^{options.length_penalty}, stopping when "
                f"{options.num_beams} hypotheses have finished (patience 1; --early_stopping is not used)"
            )
        return f"CTranslate2 {search}, max output length = input length + {self.max_length_offset}"

    def seed(self, seed: int) -> None:
        """Seed CTranslate2's sampling. Its threads seed their generators when they first sample, so a
        translator that has sampled already is loaded anew (the same weights) for the seed to apply."""
        import ctranslate2

        ctranslate2.set_random_seed(seed)
        if self._sampled:
            self.translator = ctranslate2.Translator(str(self.folder), **self._translator_args)
            self._sampled = False

    def generate_hypotheses(
        self,
        tokenizer: Any,
        input_ids: list[list[int]],
        options: DecodingOptions,
        nbest: int | None = None,
        max_new_tokens: int | None = None,
        target_prefixes: list[list[int]] | None = None,
    ) -> list[list[tuple[list[int], float | None]]]:
        """What :func:`generate_hypotheses` returns, for unpadded ``input_ids``; ``target_prefixes``: the
        token ids each output starts with (CTranslate2's ``target_prefix``; ``[]``: none)."""
        if options.length_penalty_type == "gnmt":
            raise ValueError("--length_penalty_type gnmt needs the transformers backend (n-best rescoring).")
        check_nbest(nbest, options.num_beams, options.do_sample)
        # generate() ends each sentence with </s> at its input length + offset: that many tokens minus one
        bounds = [len(ids) + self.max_length_offset - 1 for ids in input_ids]
        longest = max(bounds) if max_new_tokens is None else min(max(bounds), max_new_tokens)
        # Sampling: each sentence is given ``nbest`` times, one sample each (CTranslate2 returns one
        # hypothesis per sampled input without beam search).
        copies = (nbest or 1) if options.do_sample else 1
        self._sampled = self._sampled or options.do_sample
        prefixes = (
            None
            if target_prefixes is None
            else [tokenizer.convert_ids_to_tokens(ids) or None for ids in target_prefixes]
        )
        results = self.translator.translate_batch(
            [tokenizer.convert_ids_to_tokens(ids) for ids in input_ids for _ in range(copies)],
            beam_size=1 if options.do_sample else options.num_beams,
            length_penalty=options.length_penalty,
            num_hypotheses=1 if options.do_sample else nbest or 1,
            return_scores=nbest is not None,
            max_decoding_length=longest,
            min_decoding_length=0,  # CTranslate2's default 1 forbids the empty translation generate() allows
            max_input_length=0,  # lengths are checked before, with a message naming the line
            target_prefix=None
            if prefixes is None
            else [prefix for prefix in prefixes for _ in range(copies)],
            sampling_topk=(options.top_k if options.do_sample else 1),
            sampling_topp=options.top_p,
            sampling_temperature=options.temperature,
        )
        hypotheses = [
            [
                (tokenizer.convert_tokens_to_ids(tokens)[:bound], result.scores[k] if nbest else None)
                for result in results[j * copies : (j + 1) * copies]
                for k, tokens in enumerate(result.hypotheses)
            ]
            for j, bound in enumerate(bounds)
        ]
        if copies > 1:  # samples best first, as n-best lists are
            hypotheses = [sorted(sentence, key=lambda hypothesis: -hypothesis[1]) for sentence in hypotheses]
        return hypotheses

    def hard_alignments(
        self, tokenizer: Any, input_ids: list[list[int]], outputs: list[list[int]], special_ids: set[int]
    ) -> list[list[tuple[int, int]]]:
        """What :func:`~hf_vanilla.inference.decoding.hard_alignments` returns, for unpadded ``input_ids``:
        each output is forced as CTranslate2's ``target_prefix`` and each of its tokens is aligned to the
        source token (never a special one) that CTranslate2's attention weighs most at the step that produced
        it. That attention is the last decoder layer's averaged over its heads in an export that says so
        (:attr:`attention_aligns`), as in the transformers backend."""
        todo = [k for k, output in enumerate(outputs) if output]
        results = self.translator.translate_batch(
            [tokenizer.convert_ids_to_tokens(input_ids[k]) for k in todo],
            target_prefix=[tokenizer.convert_ids_to_tokens(outputs[k]) for k in todo],
            beam_size=1,
            max_decoding_length=max((len(outputs[k]) for k in todo), default=1),
            min_decoding_length=0,
            max_input_length=0,
            return_attention=True,
        )
        aligned: list[list[tuple[int, int]]] = [[] for _ in outputs]
        for k, result in zip(todo, results, strict=True):
            alignable = [s for s, token in enumerate(input_ids[k]) if token not in special_ids]
            if alignable:
                rows = result.attention[0][: len(outputs[k])]
                aligned[k] = [(max(alignable, key=row.__getitem__), t) for t, row in enumerate(rows)]
        return aligned
