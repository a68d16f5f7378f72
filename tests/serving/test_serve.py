"""hf-vanilla-serve: concurrent requests batched together give the translate command's output; bad
requests get one line and a 4xx; a full queue answers 503 with Retry-After; SIGTERM drains."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import ROOT, varied_model_folder

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from hf_vanilla.cli.translate import main as translate_main
from hf_vanilla.inference.loading import load_model_and_tokenizer
from hf_vanilla.inference.options import DecodingOptions, InferenceModelArguments
from hf_vanilla.serving.app import create_app
from hf_vanilla.serving.options import ServeOptions

#: Eight clients' texts: different lengths, so that batching them pads.
CLIENT_TEXTS = [
    [" ".join(f"w{(7 * c + 3 * i + k) % 90}" for k in range(1 + (c + i) % 6)) for i in range(2)]
    for c in range(8)
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return varied_model_folder(tmp_path_factory.mktemp("serve") / "model")


@pytest.fixture(scope="module")
def loaded(folder: Path) -> tuple[object, object]:
    return _load(folder)


def _load(folder: Path) -> tuple[object, object]:
    args = InferenceModelArguments(model_name_or_path=str(folder), device="cpu")
    return load_model_and_tokenizer(args, allow_ctranslate2=True)


def _client(loaded: tuple[object, object], api_key: str | None = None, **limits: object) -> TestClient:
    model, tokenizer = loaded
    options = ServeOptions(**{"max_wait_ms": 0.0, **limits})
    return TestClient(create_app(model, tokenizer, options, DecodingOptions(), "cpu", api_key=api_key))


def _cli_translations(folder: Path, lines: list[str], tmp_path: Path, *flags: str) -> list[str]:
    source, output = tmp_path / "source.txt", tmp_path / "output.txt"
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    argv = ["--model_name_or_path", str(folder), "--device", "cpu", "--input_file", str(source)]
    assert translate_main([*argv, "--output_file", str(output), "--overwrite", *flags]) == 0
    return output.read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize(
    ("backend", "flags"),
    [("transformers", ()), ("transformers", ("--num_beams", "1", "--max_length", "6")), ("ctranslate2", ())],
)
def test_concurrent_clients_get_the_translate_command_output(
    folder: Path, loaded: tuple[object, object], tmp_path: Path, backend: str, flags: tuple[str, ...]
) -> None:
    """8 clients at once: each gets hf-vanilla-translate's translations of its texts, and the server
    translated them in fewer batches than requests (they were batched together)."""
    if backend == "ctranslate2":
        pytest.importorskip("ctranslate2")
        from hf_vanilla.interop.export_ctranslate2 import export_ctranslate2

        folder = Path(export_ctranslate2(folder, tmp_path / "ct2"))
        loaded = _load(folder)
    fields = {flags[i].removeprefix("--"): int(flags[i + 1]) for i in range(0, len(flags), 2)}
    expected = _cli_translations(folder, [text for texts in CLIENT_TEXTS for text in texts], tmp_path, *flags)
    responses: dict[int, object] = {}
    with _client(loaded, max_wait_ms=500.0) as client:
        start = threading.Barrier(len(CLIENT_TEXTS))

        def ask(c: int) -> None:
            start.wait()
            responses[c] = client.post("/translate", json={"texts": CLIENT_TEXTS[c], **fields})

        threads = [threading.Thread(target=ask, args=(c,)) for c in range(len(CLIENT_TEXTS))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        health = client.get("/health").json()
    for c, texts in enumerate(CLIENT_TEXTS):
        assert responses[c].status_code == 200, responses[c].text
        assert responses[c].json()["translations"] == expected[2 * c : 2 * c + len(texts)]
    assert len(set(expected)) >= 4  # translations that tell the inputs apart
    assert health["backend"] == backend and health["requests"] == len(CLIENT_TEXTS)
    assert health["batches"] < len(CLIENT_TEXTS)


def test_nbest_and_options_are_the_translate_command_s(
    folder: Path, loaded: tuple[object, object], tmp_path: Path
) -> None:
    texts = CLIENT_TEXTS[3]
    expected = _cli_translations(
        folder, texts, tmp_path, "--num_beams", "3", "--nbest", "2", "--length_penalty", "1.0"
    )
    with _client(loaded) as client:
        reply = client.post(
            "/translate", json={"texts": texts, "num_beams": 3, "nbest": 2, "length_penalty": 1.0}
        )
    assert reply.status_code == 200, reply.text
    got = [
        f"{i}\t{h['score']:.4f}\t{h['text']}" for i, best in enumerate(reply.json()["nbest"]) for h in best
    ]
    assert got == expected


def test_prefixes_alignments_and_sentence_splitting_are_the_translate_command_s(
    folder: Path, loaded: tuple[object, object], tmp_path: Path
) -> None:
    """Two clients at once, both asking for alignments and one with target prefixes (one batch), get the
    command's outputs and alignment lines; a request with split_sentences gets the command's --split_sentences output."""
    texts = [*CLIENT_TEXTS[3], *CLIENT_TEXTS[5]]
    prefixes = ["w9", "", "w30 w31", ""]
    (tmp_path / "prefixes.txt").write_text("\n".join(prefixes) + "\n", encoding="utf-8")
    expected = _cli_translations(
        folder, texts, tmp_path, "--target_prefix_file", str(tmp_path / "prefixes.txt"),
        "--alignment_file", str(tmp_path / "alignments.txt"),
    )  # fmt: skip
    alignments = (tmp_path / "alignments.txt").read_text(encoding="utf-8").splitlines()
    assert expected[0].startswith("w9") and expected[2].startswith("w30 w31") and all(alignments)
    plain = _cli_translations(folder, CLIENT_TEXTS[6], tmp_path)
    requests = [
        {"texts": texts, "target_prefixes": prefixes, "alignments": True},
        {"texts": CLIENT_TEXTS[6], "alignments": True},
    ]
    replies: dict[int, object] = {}
    with _client(loaded, max_wait_ms=500.0) as client:
        start = threading.Barrier(len(requests))

        def ask(r: int) -> None:
            start.wait()
            replies[r] = client.post("/translate", json=requests[r])

        threads = [threading.Thread(target=ask, args=(r,)) for r in range(len(requests))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert client.get("/health").json()["batches"] == 1  # the request with prefixes joined the other
        paragraphs = ["w4 w5. w7!  w6 w7 w8?", "w9 w10"]
        split = client.post("/translate", json={"texts": paragraphs, "split_sentences": "en"})
    got = replies[0].json()
    assert got["translations"] == expected
    assert [" ".join(f"{s}-{t}" for s, t in pairs) for pairs in got["alignments"]] == alignments
    assert replies[1].json()["translations"] == plain and len(replies[1].json()["alignments"]) == 2
    pytest.importorskip("pysbd")
    assert split.status_code == 200, split.text
    assert split.json()["translations"] == _cli_translations(
        folder, paragraphs, tmp_path, "--split_sentences", "en"
    )
    assert "alignments" not in split.json() and "nbest" not in split.json()


def test_an_ensemble_is_served_as_the_command_translates_it(folder: Path, tmp_path: Path) -> None:
    from hf_vanilla.inference.loading import load_for_translation

    other = varied_model_folder(tmp_path / "other", seed=5)
    args = InferenceModelArguments(model_name_or_path=str(folder), device="cpu", ensemble=str(other))
    texts = [text for texts in CLIENT_TEXTS for text in texts]
    expected = _cli_translations(folder, texts, tmp_path, "--ensemble", str(other))
    assert expected != _cli_translations(folder, texts, tmp_path)  # the second model counted
    with _client(load_for_translation(args)) as client:
        reply = client.post("/translate", json={"texts": texts})
    assert reply.status_code == 200, reply.text
    assert reply.json()["translations"] == expected


def _one_line_error(reply: object, status: int) -> str:
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert "\n" not in error and "Traceback" not in error
    return error


BAD_REQUESTS = [
    ("not json", b'{"texts": ["w1"', 400, "not valid JSON"),
    ("not UTF-8", b'{"texts": ["\xff"]}', 400, "send UTF-8"),
    ("a list, not an object", b'["w1"]', 422, "must be a JSON object"),
    ("texts missing", b'{"num_beams": 2}', 422, "texts"),
    ("texts of the wrong type", b'{"texts": "w1 w2"}', 422, "texts"),
    ("a text of the wrong type", b'{"texts": ["w1", 3]}', 422, "texts.1"),
    ("an option of the wrong type", b'{"texts": ["w1"], "num_beams": "four"}', 422, "num_beams"),
    ("an unknown field", b'{"texts": ["w1"], "beam": 4}', 422, "unknown field 'beam'"),
    ("no texts", b'{"texts": []}', 422, "at least one text"),
    ("a blank text", b'{"texts": ["w1", "  "]}', 422, "texts[1] is blank"),
    ("too many texts", json.dumps({"texts": ["w1"] * 5}).encode(), 422, "at most 4 per request"),
    (
        "a text over the longest input",
        json.dumps({"texts": ["w1", "w2 " * 80]}).encode(),
        422,
        "texts[1]: 81 tokens",
    ),
    ("a decoding option out of range", b'{"texts": ["w1"], "num_beams": 0}', 422, "num_beams 0"),
    (
        "nbest over the beam",
        b'{"texts": ["w1"], "num_beams": 2, "nbest": 3}',
        422,
        "nbest 3 needs num_beams >= 3",
    ),
    ("a body over the cap", json.dumps({"texts": ["w1 " * 200]}).encode(), 413, "over 500 bytes"),
    (
        "not one prefix per text",
        b'{"texts": ["w1", "w2"], "target_prefixes": ["w3"]}',
        422,
        "target_prefixes has 1 entries for 2 texts",
    ),
    ("an empty prefix list", b'{"texts": ["w1"], "target_prefixes": []}', 422, "has 0 entries for 1 texts"),
    (
        "a prefix over the output bound",
        json.dumps({"texts": ["w1"], "target_prefixes": ["w2 " * 60]}).encode(),
        422,
        "target_prefixes[0]: the prefix has 60 tokens",
    ),
    (
        "sentence splitting with nbest and alignments",
        b'{"texts": ["w1"], "split_sentences": "en", "nbest": 1, "alignments": true}',
        422,
        "leave out nbest, alignments",
    ),
    ("an unknown splitting language", b'{"texts": ["w1"], "split_sentences": "xx"}', 422, "pysbd splits"),
    (
        "a sentence over the longest input",
        json.dumps({"texts": ["w1. " + "w2 " * 80], "split_sentences": "en"}).encode(),
        422,
        "texts[0], one of its sentences: 81 tokens",
    ),
]


@pytest.mark.parametrize(
    ("body", "status", "says"), [case[1:] for case in BAD_REQUESTS], ids=[case[0] for case in BAD_REQUESTS]
)
def test_bad_requests_get_one_line_and_a_4xx(
    loaded: tuple[object, object], body: bytes, status: int, says: str
) -> None:
    with _client(loaded, max_texts=4, max_body_bytes=500) as client:
        reply = client.post("/translate", content=body, headers={"Content-Type": "application/json"})
        assert says in _one_line_error(reply, status)
        assert client.post("/translate", json={"texts": ["w1"]}).status_code == 200  # still serving


def test_a_body_sent_in_chunks_is_held_to_the_cap(loaded: tuple[object, object]) -> None:
    """Without Content-Length, the body is counted as it arrives."""
    with _client(loaded, max_body_bytes=500) as client:
        chunks = iter([b'{"texts": ["', b"w1 " * 300, b'"]}'])
        reply = client.post("/translate", content=chunks, headers={"Content-Type": "application/json"})
    assert "over 500 bytes" in _one_line_error(reply, 413)


def test_the_api_key_is_asked_for(loaded: tuple[object, object]) -> None:
    with _client(loaded, api_key="s3cret") as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            reply = client.post("/translate", json={"texts": ["w1"]}, headers=headers)
            assert "API key" in _one_line_error(reply, 401)
        assert client.get("/health").status_code == 200
        reply = client.post("/translate", json={"texts": ["w1"]}, headers={"Authorization": "Bearer s3cret"})
        assert reply.status_code == 200, reply.text


def test_a_full_queue_answers_503_with_retry_after(
    loaded: tuple[object, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the model worker busy and one request waiting, the next gets 503 and Retry-After at once."""
    import hf_vanilla.serving.app as app_module

    release = threading.Event()
    started = threading.Event()
    real = app_module.translate_nbest

    def slow(*args: object, **kwargs: object) -> object:
        started.set()
        release.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(app_module, "translate_nbest", slow)
    with _client(loaded, max_queue=1) as client:
        replies: list[object] = []
        first = threading.Thread(
            target=lambda: replies.append(client.post("/translate", json={"texts": ["w1"]}))
        )
        first.start()
        assert started.wait(30)  # the worker holds the first request
        second = threading.Thread(
            target=lambda: replies.append(client.post("/translate", json={"texts": ["w2"]}))
        )
        second.start()
        deadline = time.monotonic() + 30
        while client.get("/health").json()["waiting"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        refused = client.post("/translate", json={"texts": ["w3"]})
        assert "busy" in _one_line_error(refused, 503)
        assert int(refused.headers["Retry-After"]) >= 1
        release.set()
        first.join(60)
        second.join(60)
    assert [reply.status_code for reply in replies] == [200, 200]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_sigterm_answers_the_requests_taken_and_exits_0(folder: Path, tmp_path: Path) -> None:
    """A real server: requests in flight when SIGTERM arrives are answered in full, new connections are
    refused, and the process exits 0."""
    import httpx

    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "serve.py"), "--model_dir", str(folder), "--device", "cpu",
         "--port", str(port), "--max_wait_ms", "5000"],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                assert server.poll() is None and time.monotonic() < deadline, server.stderr.read()
                time.sleep(0.2)
        replies: list[object] = []
        clients = [
            threading.Thread(
                target=lambda t=t: replies.append(
                    httpx.post(f"{url}/translate", json={"texts": t}, timeout=120)
                )
            )
            for t in CLIENT_TEXTS[:4]
        ]
        for client in clients:
            client.start()
        while httpx.get(f"{url}/health").json()["waiting"] < len(clients):  # taken, waiting for the batch
            assert time.monotonic() < deadline
            time.sleep(0.01)
        server.send_signal(signal.SIGTERM)
        for client in clients:
            client.join(120)
        assert server.wait(120) == 0
        log = server.stderr.read()
    finally:
        if server.poll() is None:
            server.kill()
    assert sorted(reply.status_code for reply in replies) == [200] * len(clients)
    assert all(reply.json()["translations"][0] for reply in replies)
    assert "Traceback" not in log, log
    assert "SIGTERM: answering the requests taken" in log


def test_health_and_the_openapi_docs(loaded: tuple[object, object]) -> None:
    """/health answers; /docs is served; the OpenAPI schema lists the request's texts and every decoding option."""
    with _client(loaded) as client:
        assert client.get("/health").json()["status"] == "ok"
        assert client.get("/docs").status_code == 200
        schema = client.get("/openapi.json").json()
    request = schema["components"]["schemas"]["TranslateRequest"]["properties"]
    assert {"texts", "max_length", "nbest", *DecodingOptions.__dataclass_fields__} <= set(request)
    assert {"400", "413", "422", "503"} <= set(schema["paths"]["/translate"]["post"]["responses"])


def test_a_port_in_use_is_refused_in_one_line_before_loading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hf_vanilla.cli.serve import main

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        status = main(["--model_dir", str(tmp_path / "no-model-here"), "--port", str(port)])
    error = capsys.readouterr().err.strip().splitlines()
    assert status == 1 and len(error) == 1
    assert error[0].startswith(f"error: --host 127.0.0.1 --port {port}: cannot listen there")


@pytest.mark.slow
def test_the_load_benchmark_runs_every_setting(tmp_path: Path) -> None:
    """``python -m benchmarks.serving.run`` at a tiny size: every backend and setting answers every
    request, and the report carries the suite's meta and table."""
    out = tmp_path / "serving.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    tiny = ["--clients", "2", "--requests", "2", "--new_tokens", "3", "--d_model", "64", "--layers", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.serving.run", *tiny, "--json_out", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["meta"]["command"].startswith("python -m benchmarks.serving.run --clients 2")
    assert len(report["table"]["rows"]) == 4
    rows = report["rows"]
    assert {(row["backend"], row["setting"]) for row in rows} == {
        (backend, setting)
        for backend in ("transformers", "ctranslate2")
        for setting in ("batched", "one at a time")
    }
    assert all(row["requests"] == 4 and row["p50_ms"] <= row["p99_ms"] for row in rows)


def test_the_batcher_joins_only_requests_of_equal_settings_within_the_token_cap() -> None:
    """Requests queued while the worker waits: those of equal settings join up to the token cap, in
    arrival order; other settings and a seeded request get batches of their own; every request gets
    its own results back."""
    from hf_vanilla.serving.batcher import RequestBatcher

    batches: list[tuple[str, list[str]]] = []
    batcher = RequestBatcher(
        lambda settings, texts: batches.append((settings, texts)) or [t.upper() for t in texts],
        max_batch_tokens=5,
        max_wait=0.5,
        max_queue=10,
    )
    submitted = [
        (["a", "b"], 2, "beam4", False),
        (["c"], 1, "greedy", False),
        (["d", "e"], 2, "beam4", False),
        (["f", "g"], 2, "beam4", False),  # over the cap of 5 tokens with the first two
        (["h"], 1, "beam4", True),  # alone (seeded)
    ]
    futures = [batcher.submit(texts, tokens, key, key, alone) for texts, tokens, key, alone in submitted]
    batcher.start()
    batcher.close()
    assert [future.result() for future in futures] == [[t.upper() for t in s[0]] for s in submitted]
    assert batches == [
        ("beam4", ["a", "b", "d", "e"]),
        ("greedy", ["c"]),
        ("beam4", ["f", "g"]),
        ("beam4", ["h"]),
    ]
