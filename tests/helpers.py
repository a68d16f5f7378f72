"""What the tests share: tiny models and configs, card arguments, a clean interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import contextlib
import json
import queue
import re
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import psutil
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    MarianConfig,
    MarianMTModel,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

from hf_vanilla import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla.io.pickles import PICKLE_SUFFIXES

# Tiny models run fastest on one thread; several threads only add synchronisation (and contend
# with each other on a shared 2-core machine).
torch.set_num_threads(1)

#: The model card's data as a training push or hf-vanilla-publish takes it (custom data, its terms, a licence).
CARD_ARGS = (
    "--dataset",
    "custom",
    "--dataset_id",
    "pairs",
    "--data_terms",
    "CC BY 4.0",
    "--weights_license",
    "cc-by-4.0",
)

TINY = {
    "vocab_size": 100,
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "max_position_embeddings": 64,
}


def tiny_config(**overrides: object) -> VanillaTransformerConfig:
    return VanillaTransformerConfig(**{**TINY, **overrides})


def tiny_model(seed: int = 0, **overrides: object) -> VanillaTransformerForConditionalGeneration:
    torch.manual_seed(seed)
    return VanillaTransformerForConditionalGeneration(tiny_config(**overrides)).eval()


#: Prepended to code run "where hf_vanilla is not installed": the editable install stays on sys.path, so
#: the import is refused instead.
BLOCK_HF_VANILLA = r"""
import sys

class _BlockHfVanilla:
    def find_spec(self, name, path=None, target=None):
        if name == "hf_vanilla" or name.startswith("hf_vanilla."):
            raise ModuleNotFoundError(f"blocked: {name}")

sys.meta_path.insert(0, _BlockHfVanilla())
"""


def run_clean(code: str, cwd: Path, *args: str, block_hf_vanilla: bool = True) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter, offline, without progress bars, stdin closed (an interactive
    prompt would print and then read EOF), with hf_vanilla not importable unless ``block_hf_vanilla`` is
    false. Fails the test with the process's stderr if it exits non-zero."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(
        HF_HUB_OFFLINE="1",
        HF_MODULES_CACHE=str(cwd / ".hf_modules"),
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
    )
    source = (BLOCK_HF_VANILLA if block_hf_vanilla else "") + code
    result = subprocess.run(
        [sys.executable, "-c", source, *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def copy_task(generator: torch.Generator, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sources of 6 random words (4…19) + </s>; the target is the source."""
    words = torch.randint(4, 20, (rows, 6), generator=generator)
    source = torch.cat([words, torch.full((rows, 1), 2)], dim=1)
    return source, source.clone()


def ending_model(seed: int) -> VanillaTransformerForConditionalGeneration:
    """A tiny random model whose hypotheses end at lengths from 1 to the bound (peaked distributions,
    a fixed logit bias on </s>), as a trained model's do (benchmarks/experiments/early_stopping.py)."""
    model = tiny_model(seed, init_std=0.5, final_logits_bias=True)
    with torch.no_grad():
        model.final_logits_bias[0, model.config.eos_token_id] = 6.0
    return model


def sources(seed: int, sentences: int = 12) -> dict[str, torch.Tensor]:
    """Right-padded random sources of 2 to 14 tokens, the last one </s>."""
    generator = torch.Generator().manual_seed(100 + seed)
    lengths = torch.randint(2, 15, (sentences,), generator=generator).tolist()
    input_ids = torch.zeros(sentences, max(lengths), dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i, n in enumerate(lengths):
        input_ids[i, : n - 1] = torch.randint(4, 99, (n - 1,), generator=generator)
        input_ids[i, n - 1] = 2
        attention_mask[i, :n] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def varied_model_folder(path: Path, seed: int = 2) -> Path:
    """A tiny model folder at ``path`` whose random model's outputs differ by input (larger tied
    embeddings), with :func:`word_tokenizer`'s tokenizer; another ``seed``, other weights."""
    from hf_vanilla.hub.folder import save_model_folder

    model = tiny_model(seed=seed)
    with torch.no_grad():
        model.model.shared.weight.mul_(3)
    save_model_folder(model, word_tokenizer(), path)
    return path


def word_tokenizer(words: int = 96) -> PreTrainedTokenizerFast:
    """conftest's tokenizer (<pad> 0, <s> 1, </s> 2, <unk> 3, then w0 w1 ...), with ``words`` words."""
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{f"w{i}": i + 4 for i in range(words)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


SMALL = {"d_model": 32, "encoder_layers": 2, "decoder_layers": 2, "max_position_embeddings": 64}


def randomize(model: PreTrainedModel, seed: int) -> PreTrainedModel:
    """Random weights large enough for peaked, input-dependent distributions (init_std 0.02 gives
    near-uniform logits, where generation would compare ties). Positional tables are left alone."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if "embed_positions" in name:
                continue
            if "layer_norm" in name:
                param.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * noise)
            elif param.dim() == 2 and any(
                k in name for k in ("embed_tokens", "shared", "lm_head", "output_proj")
            ):
                param.copy_(0.5 * noise)
            elif param.dim() == 2:
                param.copy_(noise / param.shape[1] ** 0.5)
            else:
                param.copy_(0.1 * noise)
        if hasattr(model, "final_logits_bias"):
            model.final_logits_bias.copy_(
                0.1 * torch.randn(model.final_logits_bias.shape, generator=generator)
            )
    # As in the OPUS-MT generation configs (fairseq never emits <pad> either): random weights would.
    model.generation_config.bad_words_ids = [[model.config.pad_token_id]]
    return model.eval()


def marian(seed: int = 0, **overrides: object) -> MarianMTModel:
    """An OPUS-MT-like Marian: <pad> is the last id and the decoder start, </s> = 0."""
    fields = {
        **SMALL,
        "vocab_size": 61,
        "encoder_attention_heads": 4,
        "decoder_attention_heads": 4,
        "encoder_ffn_dim": 64,
        "decoder_ffn_dim": 64,
        "activation_function": "swish",
        "scale_embedding": False,
        "pad_token_id": 60,
        "eos_token_id": 0,
        "forced_eos_token_id": 0,
        "decoder_start_token_id": 60,
        **overrides,
    }
    torch.manual_seed(seed)
    return randomize(MarianMTModel(MarianConfig(**fields)), seed)


def save_with_side_files(model: PreTrainedModel, folder: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "README.md").write_text("---\nlicense: cc-by-4.0\n---\n# an OPUS-MT model\n")
    (folder / "LICENSE").write_text("CC-BY 4.0\n")


ROOT = Path(__file__).resolve().parents[1]

DRIVER = ROOT / "tests" / "train_driver.py"

CONFIGS = ROOT / "configs" / "accelerate"

TRAIN, VALID = 48, 7  # 7 validation sentences: not a multiple of 2 processes × 2 per batch


class Outputs:
    """The output (stdout with stderr) of child processes started with ``stdout=PIPE, text=True``, read
    line by line by one thread each as it comes: a test waits for a line (an event) with a deadline,
    never polls, and still has every line afterwards."""

    def __init__(self, *processes: subprocess.Popen) -> None:
        self.lines: dict[int, list[str]] = {process.pid: [] for process in processes}
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._open = len(processes)
        self._readers = {
            process.pid: threading.Thread(target=self._read, args=(process,), daemon=True)
            for process in processes
        }
        for reader in self._readers.values():
            reader.start()

    def _read(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            self.lines[process.pid].append(line)
            self._queue.put(line)
        self._queue.put(None)

    def text(self, process: subprocess.Popen | None = None) -> str:
        pids = [process.pid] if process is not None else list(self.lines)
        return "".join(line for pid in pids for line in self.lines[pid])

    def wait_for(self, pattern: str, timeout: float, count: int = 1) -> re.Match:
        """Return the match of the ``count``-th line (of any of the processes) that matches ``pattern``;
        fail when the deadline passes or every process has closed its output first."""
        deadline, seen = time.monotonic() + timeout, 0
        while True:
            try:
                line = self._queue.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                raise AssertionError(
                    f"no {count} lines matching {pattern!r} within {timeout} s:\n{self.text()[-4000:]}"
                ) from None
            if line is None:
                self._open -= 1
                assert self._open > 0, (
                    f"the output ended before {count} lines matched {pattern!r}:\n{self.text()[-4000:]}"
                )
            elif (match := re.search(pattern, line)) and (seen := seen + 1) == count:
                return match

    def closed(self, process: subprocess.Popen, timeout: float) -> str:
        """The whole output of ``process`` once every process holding it open (its children too) has ended."""
        reader = self._readers[process.pid]
        reader.join(timeout)
        assert not reader.is_alive(), (
            f"its output was still open after {timeout} s:\n{self.text(process)[-4000:]}"
        )
        return self.text(process)


def gloo_threads() -> int:
    """How many of this process's threads gloo runs for process groups (``pt_gloo_runloop``, as Linux
    names them): 0 once every group is really gone, not merely unregistered from torch.distributed."""
    tasks = Path("/proc/self/task")
    return sum((task / "comm").read_text().strip() == "pt_gloo_runloop" for task in tasks.iterdir())


def kill_processes_mentioning(path: Path) -> None:
    """SIGKILL every process whose command line names ``path``: a test's launches and what they
    started, also in sessions of their own (``torchrun`` starts its workers so) or orphaned."""
    me = os.getpid()
    for process in psutil.process_iter(["pid", "cmdline"]):
        if process.info["pid"] != me and any(str(path) in arg for arg in process.info["cmdline"] or ()):
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGKILL)


def train_args(tokenizer_dir: Path | None, output_dir: Path, *extra: str) -> list[str]:
    """The demo task (EN→DE numbers), a tiny model, 4 steps, no dropout (ranks draw different masks),
    then evaluation with generation (§6.1 beam search) on the 7 validation sentences. Without a
    tokenizer folder, the run trains its own tokenizer (300 tokens)."""
    tokenizer = (
        ["--tokenizer_vocab_size", "300"]
        if tokenizer_dir is None
        else ["--tokenizer_name_or_path", str(tokenizer_dir)]
    )
    return [
        "--demo", "--demo_train_size", str(TRAIN), "--demo_validation_size", str(VALID), "--demo_test_size", "0",
        *tokenizer,
        "--d_model", "32", "--layers", "2", "--attention_heads", "4", "--ffn_dim", "64", "--dropout", "0",
        "--max_steps", "4", "--learning_rate", "1e-3", "--warmup_steps", "1", "--logging_steps", "1",
        "--save_strategy", "no", "--eval_strategy", "no", "--per_device_eval_batch_size", "2",
        "--report_to", "none", "--use_cpu", "--disable_tqdm", "true", "--seed", "0",
        "--output_dir", str(output_dir), *extra,
    ]  # fmt: skip


def _env(record_dir: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(ROOT),
        HF_VANILLA_RECORD_DIR=str(record_dir),
        **extra,
    )
    return env


def _launchers(name: str) -> list[str]:
    if name == "python":
        return [sys.executable, str(DRIVER)]
    if name == "torchrun":
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(DRIVER),
        ]
    if name == "accelerate":  # the repository's DDP config (MULTI_GPU), on CPU: 2 gloo processes
        return [
            sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / "ddp.yaml"),
            "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", "0", str(DRIVER),
        ]  # fmt: skip
    if name == "accelerate-fsdp":  # the repository's FSDP config, as a user would launch it
        return [
            sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / "fsdp.yaml"),
            "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", "0", str(DRIVER),
        ]  # fmt: skip
    if name == "accelerate-flag":
        return [
            sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", "0", str(DRIVER),
        ]  # fmt: skip
    if name == "accelerate-cpu":
        return [
            sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2",
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(DRIVER),
        ]  # fmt: skip
    raise ValueError(name)


class Run:
    """One launched training run and what each of its processes recorded.

    ``accelerate launch --main_process_port 0`` lets accelerate pick the port (it cannot hand a bound
    socket to torch): the OS names a free one, and torch binds it a moment later. Should another process
    take it in between, the launch fails with EADDRINUSE before any worker starts (nothing written), and
    :meth:`wait` launches it once more."""

    def __init__(self, root: Path, launcher: str, args: list[str], env: dict[str, str] | None = None) -> None:
        self.root, self.out, self.record = root, root / "out", root / "record"
        self.command = [*_launchers(launcher), *args]
        self.env = {**_env(self.record), **(env or {})}
        self.process = self._start()
        self.log = ""

    def _start(self) -> subprocess.Popen:
        return subprocess.Popen(
            self.command, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    def finish(self) -> None:
        """Wait (at most 900 s each try; on timeout kill the launcher and its workers) and keep the log."""
        for attempt in range(2):
            try:
                self.log = self.process.communicate(timeout=900)[0]
            except subprocess.TimeoutExpired:
                kill_processes_mentioning(self.root)  # the launcher's workers too
                raise
            if self.process.returncode == 0 or "EADDRINUSE" not in self.log or attempt == 1:
                return
            self.process = self._start()  # the port accelerate picked was taken before torch bound it

    def wait(self) -> Run:
        self.finish()
        assert self.process.returncode == 0, f"{' '.join(self.command)}\n{self.log[-4000:]}"
        return self

    def refused(self, message: str) -> Run:
        """The run failed, every process printed ``message`` as its one error line, nothing was written."""
        self.finish()
        assert self.process.returncode != 0, self.log[-4000:]
        errors = [line for line in self.log.splitlines() if line.startswith("error: ")]
        assert errors and all(message in line for line in errors), self.log[-4000:]
        assert "LaunchError" not in self.log  # no traceback of ours, one line
        assert not self.out.exists() and not self.record.exists()
        return self

    def ranks(self) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted(self.record.glob("rank-*.json"))]

    def exits(self) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted(self.record.glob("exit-rank*.json"))]

    def params(self, rank: int = 0) -> dict[str, torch.Tensor]:
        return load_file(self.record / f"params-rank{rank}.safetensors")

    def losses(self, rank: int = 0) -> list[float]:
        lines = (self.record / f"logs-rank{rank}.jsonl").read_text().splitlines()
        return [record["loss"] for record in map(json.loads, lines) if "loss" in record]

    def evaluation(self, rank: int = 0) -> dict[str, Any]:
        return json.loads((self.record / f"eval-rank{rank}-0.json").read_text())


def check_matches_one_process(run: Run, single: Run, atol: float = 5e-7) -> None:
    """docs/scaling.md: per-step losses equal to 2e-7 relative, parameters within ``atol`` (5e-7)."""
    assert single.ranks()[0]["world_size"] == 1
    losses, reference = run.losses(), single.losses()
    assert len(losses) == len(reference) == 4
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference), rtol=2e-7, atol=0)
    assert losses[0] != losses[-1]  # it trained
    got, expected = run.params(), single.params()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=atol, msg=key)


SENTENCES = ["w1 w2 w3", "w4", "w5 w6"]

LOAD = r"""
import json, sys, warnings
warnings.simplefilter("always")
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

folder, sentences = sys.argv[1], json.loads(sys.argv[2])
model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
ids = model.generate(**tokenizer(sentences, padding=True, return_tensors="pt"), max_new_tokens=8)
translator = pipeline("vanilla-translation", model=folder, trust_remote_code=True)
texts = [row["translation_text"] for row in translator(sentences, batch_size=2, max_new_tokens=8)]
assert not any(name == "hf_vanilla" or name.startswith("hf_vanilla.") for name in sys.modules)
print(json.dumps({"module": type(model).__module__, "ids": ids.tolist(), "texts": texts,
                  "pipeline": type(translator).__name__, "max_length": tokenizer.model_max_length}))
"""


def assert_self_contained(folder: Path, tmp_path: Path, checkpoint: bool = False) -> dict:
    """The clean-process load of ``folder``; returns what it printed. Checks no pickle (a Trainer
    ``checkpoint`` excepted: its resume state is the Trainer's, checked by ``verify_checkpoint``), no
    warning."""
    pickles = [path.name for path in folder.iterdir() if path.suffix in PICKLE_SUFFIXES]
    assert checkpoint or not pickles, f"pickled files in {folder}: {pickles}"
    result = run_clean(LOAD, tmp_path, str(folder), json.dumps(SENTENCES))
    assert "Do you wish to run the custom code" not in result.stdout + result.stderr
    assert not re.search(r"warn|You are using a model of type", result.stderr, re.IGNORECASE), result.stderr
    remote = json.loads(result.stdout.strip().splitlines()[-1])
    assert remote["module"].startswith("transformers_modules.")
    assert remote["pipeline"] == "VanillaTranslationPipeline"
    local = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        ids = local.generate(**tokenizer(SENTENCES, padding=True, return_tensors="pt"), max_new_tokens=8)
    assert remote["ids"] == ids.tolist()
    # The pipeline translates each sentence alone (batches of 2 padded): same as generate() per sentence.
    expected = [
        tokenizer.decode(
            local.generate(**tokenizer([s], return_tensors="pt"), max_new_tokens=8)[0],
            skip_special_tokens=True,
        )
        for s in SENTENCES
    ]
    assert remote["texts"] == expected
    return remote


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.DOTALL)


def run_card(folder: Path, tmp_path: Path, block_hf_vanilla: bool = True) -> None:
    """Run every fenced Python block of the folder's README.md verbatim in a clean process."""
    blocks = python_blocks((folder / "README.md").read_text(encoding="utf-8"))
    assert blocks, f"{folder}/README.md has no Python example"
    for block in blocks:
        run_clean(block, tmp_path, block_hf_vanilla=block_hf_vanilla)


@contextlib.contextmanager
def fed_pipes(folder: Path, texts: tuple[str, ...]) -> Iterator[list[Path]]:
    """Named pipes in ``folder`` (as bash's ``<(...)`` gives), one per text, each written by a thread as
    soon as a reader opens it; the writers are joined on leaving."""
    pipes = [folder / f"pipe{index}" for index in range(len(texts))]
    writers = []
    for pipe, text in zip(pipes, texts, strict=True):
        os.mkfifo(pipe)
        writers.append(threading.Thread(target=pipe.write_text, args=(text,), daemon=True))
        writers[-1].start()
    yield pipes
    for writer in writers:
        writer.join(timeout=10)
