"""Loading a model folder (or Hub id) with its tokenizer for inference: backend, device, dtype,
quantization."""

from __future__ import annotations

from typing import Any

import torch

from hf_vanilla.data.tokenization import check_tokenizer_matches_config, load_tokenizer
from hf_vanilla.inference.ctranslate2 import load_ctranslate2_and_tokenizer, resolve_backend
from hf_vanilla.inference.options import DTYPE_NAMES, InferenceModelArguments
from hf_vanilla.inference.quantization import check_route, from_pretrained_kwargs, quantize_loaded
from hf_vanilla.io.checked_loading import load_pretrained_checked
from hf_vanilla.io.checkpoints import deleted_while_read

__all__ = [
    "DTYPES",
    "check_dtype",
    "load_for_translation",
    "load_model_and_tokenizer",
    "resolve_device",
]

#: ``--dtype`` values and the torch dtype of each (``auto``: as saved / as exported).
DTYPES = dict(zip(DTYPE_NAMES, (None, torch.float32, torch.bfloat16, torch.float16), strict=True))


def load_model_and_tokenizer(
    args: InferenceModelArguments, attn_implementation: str | None = None, allow_ctranslate2: bool = False
) -> tuple[Any, Any]:
    """Load the model and tokenizer (importing hf_vanilla has registered its Auto classes) and check that
    they belong together (:func:`hf_vanilla.data.tokenization.check_tokenizer_matches_config`);
    ``args.quantization`` names a route of :mod:`hf_vanilla.inference.quantization`, ``args.dtype`` one of
    :data:`DTYPES`. With the ``ctranslate2`` backend (only where ``allow_ctranslate2``: commands that
    only translate) the model is a :class:`CTranslate2Model`. A training checkpoint deleted while it is
    read (a run rotating its checkpoints) raises :class:`~hf_vanilla.io.errors.CheckpointDeletedError`,
    not an error calling it damaged."""
    backend = resolve_backend(args)
    if args.dtype not in DTYPES:
        raise ValueError(f"Unknown --dtype {args.dtype!r}: choose one of {', '.join(DTYPES)}.")
    if backend == "ctranslate2":
        if not allow_ctranslate2:
            raise ValueError(
                f"--model_name_or_path {args.model_name_or_path!r} is a CTranslate2 export (or --backend "
                "ctranslate2 was given): this command needs the transformers model folder it was exported from."
            )
        return load_ctranslate2_and_tokenizer(args)  # CTranslate2 resolves --device itself
    device = resolve_device(args.device)
    tokenizer_source = args.tokenizer_name_or_path or args.model_name_or_path
    check_route(args.quantization, device)
    kwargs: dict[str, Any] = {"trust_remote_code": args.trust_remote_code}
    kwargs.update(from_pretrained_kwargs(args.quantization))
    if args.dtype != "auto":
        if args.quantization != "none":
            raise ValueError(
                f"--dtype {args.dtype} and --quantization {args.quantization} both set the precision: give one."
            )
        check_dtype(DTYPES[args.dtype], device)
        kwargs["dtype"] = DTYPES[args.dtype]
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    with deleted_while_read(args.model_name_or_path):  # a checkpoint a training run rotates away meanwhile
        model = load_pretrained_checked(args.model_name_or_path, **kwargs)
        tokenizer = load_tokenizer(tokenizer_source, trust_remote_code=args.trust_remote_code)
    check_tokenizer_matches_config(
        tokenizer, model.config, f"tokenizer {tokenizer_source}, model {args.model_name_or_path}"
    )
    model = quantize_loaded(model.to(device), args.quantization).eval()
    return model, tokenizer


def load_for_translation(args: InferenceModelArguments) -> tuple[Any, Any]:
    """The model and tokenizer that translate, evaluate, the server and :class:`Translator` decode with:
    ``args.model_name_or_path`` alone (a transformers folder or a CTranslate2 export, as
    :func:`load_model_and_tokenizer` loads it), or with ``args.ensemble`` (more folders, comma-separated)
    the ensemble of all of them (:func:`hf_vanilla.inference.ensemble.load_ensemble`)."""
    if args.ensemble is None:
        return load_model_and_tokenizer(args, allow_ctranslate2=True)
    from hf_vanilla.inference.ensemble import load_ensemble, parse_ensemble

    return load_ensemble(args, parse_ensemble(args.ensemble))


def check_dtype(dtype: torch.dtype, device: torch.device) -> None:
    """Refuse a dtype ``device`` cannot compute in (bf16 on a GPU without it, or any failing kernel),
    with the choices that work, instead of a kernel error in the middle of decoding."""
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise ValueError(f"--dtype bfloat16: {device} does not support bfloat16; use float16 or float32.")
    try:  # the model's kernels: a matrix product and a softmax
        probe = torch.ones(2, 2, dtype=dtype, device=device)
        torch.nn.functional.linear(probe, probe).softmax(dim=-1)
    except RuntimeError as err:
        raise ValueError(
            f"--dtype {str(dtype).removeprefix('torch.')}: {device} cannot compute in it ({str(err).splitlines()[0]}); "
            "use float32."
        ) from None


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None`` or ``"auto"`` → CUDA if available, else CPU; otherwise the named device."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("`device` is 'cuda' but no CUDA GPU is visible: use --device cpu.")
    return device
