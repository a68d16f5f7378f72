"""The translation server: a FastAPI application over a loaded model (either backend).

``POST /translate`` takes ``{"texts": [...]}`` and any of :class:`DecodingOptions`' fields (the server's
own settings are the defaults), ``max_length``, ``nbest``, ``target_prefixes`` (one per text),
``alignments`` and ``split_sentences``, as the translate command's flags of those names; ``GET /health``
says the server is up;
``/docs`` and ``/openapi.json`` describe both. Requests are checked on arrival (each text's length
against the model's longest input, each target prefix against its output bound, as the translate command
checks them) and translated by one
:class:`~hf_vanilla.serving.batcher.RequestBatcher`. Every refusal is a JSON object ``{"error": "<one
line>"}``: 400 for a body that is not JSON, 401 for a missing or wrong API key, 413 for a body over
the size cap, 422 for fields of the wrong type or value, 501 for sentence splitting on a server without
pysbd, 503 with ``Retry-After`` when too many requests wait.
"""

import asyncio
import copy
import hmac
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import asdict, fields
from typing import Annotated, Any, get_type_hints

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, create_model
from starlette.exceptions import HTTPException

from hf_vanilla.inference.ctranslate2 import CTranslate2Model
from hf_vanilla.inference.options import DecodingOptions, Hypothesis, check_nbest
from hf_vanilla.inference.translation import (
    InputTooLongError,
    TargetPrefixError,
    TranslationOutOfMemoryError,
    check_input_length,
    sentence_splitter,
    target_prefix_ids,
    translate_nbest,
)
from hf_vanilla.serving.batcher import QueueFullError, RequestBatcher
from hf_vanilla.serving.options import API_KEY_VARIABLE, ServeOptions

logger = logging.getLogger(__name__)

__all__ = ["create_app"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]
]

#: The refusals of ``POST /translate``, as its OpenAPI description lists them.
_REFUSALS: dict[int | str, dict[str, Any]] = {
    400: {"description": "The body is not JSON."},
    401: {"description": "Missing or wrong API key."},
    413: {"description": "The body is over the size cap."},
    422: {
        "description": "A field of the wrong type or value, a blank text, too many texts, a text too long, a "
        "target prefix too long, options that do not go together."
    },
    501: {"description": "split_sentences on a server without pysbd."},
    503: {"description": "Too many requests wait: retry after Retry-After seconds."},
}

#: A batch's settings: decoding, max_length, nbest, alignments, split_sentences.
_Settings = tuple[DecodingOptions, int | None, int | None, bool, str | None]

#: Fields of a request besides the texts and the decoding options.
_REQUEST_ONLY = ("texts", "max_length", "nbest", "target_prefixes", "alignments", "split_sentences")


def _decoding_fields() -> dict[str, Any]:
    """:class:`DecodingOptions`' fields as optional request fields, described by their ``--help``."""
    hints = get_type_hints(DecodingOptions)
    return {
        item.name: (hints[item.name] | None, Field(None, description=item.metadata["help"]))
        for item in fields(DecodingOptions)
    }


class Translation(BaseModel):
    text: str
    score: float | None = None


class TranslateResponse(BaseModel):
    translations: list[str] = Field(description="One translation per text, in order.")
    nbest: list[list[Translation]] | None = Field(
        None, description="With nbest: each text's best translations and their scores, best first."
    )
    alignments: list[list[tuple[int, int]]] | None = Field(
        None,
        description="With alignments: each translation's hard alignment, [source token, target token] "
        "index pairs (the translate command's --alignment_file).",
    )


class Health(BaseModel):
    status: str
    backend: str
    waiting: int = Field(description="Requests waiting for the model worker.")
    requests: int = Field(description="Requests translated since the start.")
    batches: int = Field(description="Batches they were translated in.")


def _one_line(text: str) -> str:
    """A message as one line, with the commands' ``--flag`` names written as the request's field names."""
    return re.sub(r"--(?=\w)", "", " ".join(str(text).split()))


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": _one_line(message)}, status_code=status, headers=headers)


_NOT_AN_OBJECT = (
    'the body must be a JSON object such as {"texts": ["a sentence"]}, sent with the header '
    "Content-Type: application/json."
)
#: What FastAPI says of a body it cannot decode (not UTF-8, for one), and what the server says instead.
_UNREADABLE = "There was an error parsing the body"


def _validation_message(error: RequestValidationError) -> tuple[int, str]:
    """The status and one line for the first problem pydantic found in a request."""
    first = error.errors()[0]
    if first.get("type") == "json_invalid":
        return 400, (
            f"the body is not valid JSON ({first.get('ctx', {}).get('error', 'cannot be parsed')}): send a JSON "
            'object such as {"texts": ["a sentence"]}.'
        )
    where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
    if not where:
        return 422, _NOT_AN_OBJECT
    if first.get("type") == "extra_forbidden":
        return 422, f"unknown field {where!r}: see /docs for the fields a request takes."
    return 422, f"{where}: {first.get('msg', 'invalid value')}. See /docs for the fields a request takes."


class _BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(
            413, f"the request body is over {limit} bytes: send fewer or shorter texts per request."
        )


class _BodyLimit:
    """Refuse a request body over ``limit`` bytes with 413: by its Content-Length before reading it, or
    while reading one sent in chunks."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(
        self,
        scope: Scope,
        receive: Callable[[], Awaitable[Message]],
        send: Callable[[Message], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            refusal = _BodyTooLarge(self.limit)
            await _error(413, refusal.detail)(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                raise _BodyTooLarge(self.limit)
            return message

        await self.app(scope, limited, send)


def create_app(
    model: Any,
    tokenizer: Any,
    options: ServeOptions,
    defaults: DecodingOptions,
    device: Any = None,
    batch_size: int = 64,
    max_tokens: int = 0,
    api_key: str | None = None,
) -> FastAPI:
    """The application serving ``model`` (a transformers model or a :class:`CTranslate2Model`) with
    ``tokenizer``; ``defaults``: the decoding of a request that names none; ``batch_size`` and
    ``max_tokens`` split a batch of requests as the translate command splits its input; ``api_key``:
    when given, ``/translate`` asks for ``Authorization: Bearer <api_key>``."""
    checker = copy.deepcopy(tokenizer)  # the requests' length checks never share the worker's tokenizer
    backend = "ctranslate2" if isinstance(model, CTranslate2Model) else "transformers"

    def generate_kwargs(max_length: int | None) -> dict[str, int]:
        return {} if max_length is None else {"max_new_tokens": max_length}

    def run(settings: _Settings, items: list[tuple[str, str]]) -> list[list[Hypothesis]]:
        """Translate the (text, target prefix) pairs of the requests batched together."""
        decoding, max_length, nbest, alignments, split = settings
        texts, prefixes = [text for text, _ in items], [prefix for _, prefix in items]
        return translate_nbest(
            model, tokenizer, texts, decoding, batch_size, device, generate_kwargs(max_length), nbest,
            max_tokens, prefixes if any(prefixes) else None, alignments, split,
        )  # fmt: skip

    splitters: dict[str, Callable[[str], list[str]]] = {}

    def source_lengths(texts: list[str], split: str | None) -> list[int]:
        """Each text's source tokens, its sentences' with ``split``; a text or sentence longer than the
        model's longest input is refused (422) before anything is translated."""
        if split is None:
            lengths = [len(ids) for ids in checker(texts)["input_ids"]]
            for i, length in enumerate(lengths):
                check_input_length(model, tokenizer, length, i, where=f"texts[{i}]")
            return lengths
        try:
            splitter = splitters.get(split) or splitters.setdefault(split, sentence_splitter(split))
        except ImportError as error:
            raise HTTPException(501, f"this server cannot split sentences: {error}") from None
        totals = []
        for i, text in enumerate(texts):
            sentences = splitter(text)[::2]
            lengths = [len(ids) for ids in checker(sentences)["input_ids"]]
            for length in lengths:
                check_input_length(model, tokenizer, length, i, where=f"texts[{i}], one of its sentences")
            totals.append(sum(lengths))
        return totals

    batcher = RequestBatcher(run, options.max_batch_tokens, options.max_wait_ms / 1000, options.max_queue)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        try:
            yield
        finally:  # after the server stopped taking requests and answered those it had
            await asyncio.to_thread(batcher.close)

    app = FastAPI(
        title="hf_vanilla translation",
        description="Translate texts with the model the server was started with.",
        lifespan=lifespan,
    )
    app.add_middleware(_BodyLimit, limit=options.max_body_bytes)
    bearer = HTTPBearer(auto_error=False, description=f"The server's API key, set in ${API_KEY_VARIABLE}.")

    def authorized(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
        given = "" if credentials is None else credentials.credentials
        if not hmac.compare_digest(given.encode(), api_key.encode()):
            raise HTTPException(
                401, "missing or wrong API key: send the header 'Authorization: Bearer <key>'.",
                headers={"WWW-Authenticate": "Bearer"},
            )  # fmt: skip

    request_model = create_model(
        "TranslateRequest",
        __config__=ConfigDict(extra="forbid", strict=True),
        texts=(
            list[str],
            Field(description=f"The texts to translate, 1 to {options.max_texts}, each non-blank."),
        ),
        max_length=(
            int | None,
            Field(None, ge=1, description="At most this many output tokens (</s> included)."),
        ),
        nbest=(
            int | None,
            Field(None, ge=1, description="Also return each text's N best translations with scores."),
        ),
        target_prefixes=(
            list[str] | None,
            Field(
                None,
                description="One target prefix per text ('' for none): each translation starts with its "
                "prefix's tokens and the rest is decoded (the translate command's --target_prefix_file).",
            ),
        ),
        alignments=(
            bool | None,
            Field(None, description="Also return each translation's hard alignment (--alignment_file)."),
        ),
        split_sentences=(
            str | None,
            Field(
                None,
                description="A language code (en, de, fr, ...): split each text into its sentences with pysbd, "
                "translate them and join them back (--split_sentences).",
            ),
        ),
        **_decoding_fields(),
    )

    async def refuse_invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        return _error(*_validation_message(error))

    async def refuse(_: Request, error: HTTPException) -> JSONResponse:
        if error.detail == _UNREADABLE:
            return _error(400, f"the body cannot be read as JSON: send UTF-8 text. {_NOT_AN_OBJECT}")
        return _error(error.status_code, str(error.detail), error.headers)

    async def fail(_: Request, error: Exception) -> JSONResponse:
        logger.error("a request failed", exc_info=error)
        return _error(500, "internal error while translating: the server's log has the details.")

    async def health() -> Health:
        return Health(
            status="ok",
            backend=backend,
            waiting=batcher.waiting,
            requests=batcher.requests,
            batches=batcher.batches,
        )

    async def translate_texts(body: request_model) -> TranslateResponse:  # type: ignore[valid-type]
        """Translate each text; the decoding options not given are the server's."""
        given = body.model_dump(exclude_unset=True)
        texts: list[str] = given["texts"]
        if not texts:
            raise HTTPException(
                422, 'texts is empty: send at least one text, e.g. {"texts": ["a sentence"]}.'
            )
        if len(texts) > options.max_texts:
            raise HTTPException(
                422, f"{len(texts)} texts: send at most {options.max_texts} per request (split the list)."
            )
        for i, text in enumerate(texts):
            if not text.strip():
                raise HTTPException(422, f"texts[{i}] is blank: send only texts with words in them.")
        given_prefixes: list[str] | None = given.get("target_prefixes")
        prefixes = [""] * len(texts) if given_prefixes is None else given_prefixes
        if len(prefixes) != len(texts):
            raise HTTPException(
                422, f"target_prefixes has {len(prefixes)} entries for {len(texts)} texts: give one per text "
                "('' for none).",
            )  # fmt: skip
        nbest, alignments, split = (
            given.get("nbest"),
            bool(given.get("alignments")),
            given.get("split_sentences"),
        )
        if split is not None:
            joined = [name for name, value in (("nbest", nbest), ("target_prefixes", given.get("target_prefixes")),
                      ("alignments", alignments or None)) if value is not None]  # fmt: skip
            if joined:
                raise HTTPException(
                    422, f"split_sentences joins one translation per sentence back into its text: leave out "
                    f"{', '.join(joined)}.",
                )  # fmt: skip
        if alignments and isinstance(model, CTranslate2Model) and not model.attention_aligns:
            raise HTTPException(
                422, "alignments: this server's CTranslate2 export keeps CTranslate2's default attention, not "
                "the heads alignments average: its operator can export it again with hf-vanilla-export-ct2.",
            )  # fmt: skip
        try:
            decoding = DecodingOptions(
                **{**asdict(defaults), **{k: v for k, v in given.items() if k not in _REQUEST_ONLY}}
            )
            check_nbest(nbest, decoding.num_beams, decoding.do_sample)
            lengths = source_lengths(texts, split)
            if any(prefixes):
                target_prefix_ids(
                    model,
                    checker,
                    texts,
                    prefixes,
                    dict(enumerate(lengths)),
                    generate_kwargs(given.get("max_length")),
                )
        except InputTooLongError as error:
            raise HTTPException(
                422, str(error).replace("Split the sentence.", "Send it in shorter pieces.")
            ) from None
        except TargetPrefixError as error:
            raise HTTPException(422, f"target_prefixes[{error.index}]: {error.reason}") from None
        except ValueError as error:
            raise HTTPException(422, str(error)) from None
        settings: _Settings = (decoding, given.get("max_length"), nbest, alignments, split)
        key = json.dumps([asdict(decoding), *settings[1:]], sort_keys=True)
        try:
            future = batcher.submit(
                list(zip(texts, prefixes, strict=True)),
                sum(lengths),
                key,
                settings,
                alone=decoding.seed is not None,
            )
        except QueueFullError as error:
            raise HTTPException(503, str(error), headers={"Retry-After": str(error.retry_after)}) from None
        try:
            hypotheses = await asyncio.wrap_future(future)
        except TranslationOutOfMemoryError as error:
            raise HTTPException(
                503, f"{error} (the server's options)", headers={"Retry-After": "1"}
            ) from None
        except ValueError as error:
            raise HTTPException(422, str(error)) from None
        return TranslateResponse(
            translations=[best[0].text if best else "" for best in hypotheses],
            nbest=None
            if nbest is None
            else [[Translation(text=h.text, score=h.score) for h in best] for best in hypotheses],
            alignments=[best[0].alignment or [] for best in hypotheses] if alignments else None,
        )

    app.add_exception_handler(RequestValidationError, refuse_invalid)
    app.add_exception_handler(HTTPException, refuse)
    app.add_exception_handler(Exception, fail)
    app.add_api_route("/health", health, methods=["GET"], response_model=Health)
    app.add_api_route(
        "/translate",
        translate_texts,
        methods=["POST"],
        response_model=TranslateResponse,
        response_model_exclude_none=True,
        dependencies=[Depends(authorized)] if api_key else [],
        responses=_REFUSALS,
    )
    return app
