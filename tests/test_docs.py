"""The documentation cannot rot: every Python snippet of README.md and docs/*.md runs, every relative
link points to a file (and heading) that exists, and CI runs exactly the README's test command.

Snippets run in this process, each in a fresh namespace, in a temporary working directory that holds a
tiny model folder ``demo_output`` (what README command 1 writes, at a tiny size and untrained), offline; a
snippet that draws writes its picture there. A translated page (:data:`TRANSLATIONS`) must have its
original's code blocks byte for byte, so its snippets are run once, on the original. A snippet that needs what a
test cannot have (the Hub, a GPU) is marked in the Markdown by ``<!-- skip-test: REASON -->`` on the line
before its fence, and listed in :data:`SKIPPED` below with that reason. Bash blocks are not run, but for the
README's translation commands (a slow test).
"""

from __future__ import annotations

import re
import sys
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import marian, save_with_side_files
from transformers import dynamic_module_utils

from hf_vanilla.hub.folder import save_model_folder

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: Snippets that are not run, by (page, first code line): the reason the page's skip-test marker gives.
SKIPPED: dict[tuple[str, str], str] = {
    ("docs/hub.md", "from transformers import pipeline"): "needs the Hub",
    ("docs/interop.md", "import torch"): "needs an ONNX export (about a minute)",
    (
        "docs/scaling.md",
        "import ray",
    ): "needs a Ray cluster and its storage (tests/inference/test_translator.py runs it locally)",
}

#: Translated pages and the page each translates.
TRANSLATIONS = {ROOT / "docs" / "walkthrough.zh.md": ROOT / "docs" / "walkthrough.md"}

FENCE = re.compile(r"^```(\w*)\s*$")
SKIP_MARKER = re.compile(r"^<!--\s*skip-test:\s*(.+?)\s*-->$")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@dataclass(frozen=True)
class Snippet:
    page: str  # relative to the repository root
    line: int  # of the opening fence, 1-based
    code: str
    skip: str | None  # the skip-test marker's reason

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def fenced_blocks(markdown: str) -> list[tuple[str, int, str, str | None]]:
    """(language, line of the opening fence, code, skip reason) of every fenced block."""
    lines = markdown.splitlines()
    blocks = []
    start = language = None
    for number, line in enumerate(lines, 1):
        match = FENCE.match(line)
        if start is None and match:
            start, language = number, match.group(1)
        elif start is not None and line.rstrip() == "```":
            previous = next((text.strip() for text in reversed(lines[: start - 1]) if text.strip()), "")
            marker = SKIP_MARKER.match(previous)
            blocks.append(
                (language, start, "\n".join(lines[start : number - 1]) + "\n", marker and marker.group(1))
            )
            start = None
    assert start is None, f"a code fence opened at line {start} is never closed"
    return blocks


def snippets(page: Path) -> list[Snippet]:
    name = page.relative_to(ROOT).as_posix()
    return [
        Snippet(name, line, code, skip)
        for language, line, code, skip in fenced_blocks(page.read_text(encoding="utf-8"))
        if language == "python"
    ]


ALL_SNIPPETS = [snippet for page in PAGES if page not in TRANSLATIONS for snippet in snippets(page)]


def first_code_line(code: str) -> str:
    return next(line for line in code.splitlines() if line.strip() and not line.startswith("#"))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = unicodedata.normalize("NFC", text.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    counts: dict[str, int] = {}
    in_code = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (heading := re.match(r"^#{1,6} (.+)$", line)):
            base = slug(heading.group(1))
            found.add(base if base not in counts else f"{base}-{counts[base]}")
            counts[base] = counts.get(base, 0) + 1
    return found


def relative_links(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)  # code blocks
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code
    return [target for target in LINK.findall(text) if not re.match(r"^[a-z]+:", target)]


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    return broken


@pytest.fixture
def docs_workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model, tokenizer) -> Iterator[Path]:
    """A working directory holding ``demo_output``: a tiny model folder written as the demo writes it.
    Remote code (``trust_remote_code=True``) is cached under it, not in the user's modules cache."""
    save_model_folder(model, tokenizer, tmp_path / "demo_output")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(dynamic_module_utils, "HF_MODULES_CACHE", str(tmp_path / ".hf_modules"))
    monkeypatch.setattr(sys, "path", list(sys.path))
    modules = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - modules:
        if name.startswith("transformers_modules"):
            del sys.modules[name]


#: The OPUS-MT model the README converts. The Hub is offline in tests, so a tiny random Marian model with a
#: tokenizer and a license stands in for it, saved in the working directory under the Hub id's name (a local
#: folder is taken before the Hub), and the snippet runs as written.
OPUS_MT = "Helsinki-NLP/opus-mt-de-en"


@pytest.mark.parametrize("snippet", ALL_SNIPPETS, ids=[snippet.id for snippet in ALL_SNIPPETS])
def test_python_snippet_runs(snippet: Snippet, docs_workdir: Path, tokenizer) -> None:
    if snippet.skip:
        pytest.skip(f"{snippet.id}: {snippet.skip}")
    if OPUS_MT in snippet.code:
        save_with_side_files(marian(), docs_workdir / OPUS_MT, tokenizer)
    namespace = {"__name__": "__main__"}
    exec(compile(snippet.code, snippet.id, "exec"), namespace)  # the repository's own documentation


def test_every_skipped_snippet_is_listed_with_its_reason() -> None:
    marked = {(s.page, first_code_line(s.code)): s.skip for s in ALL_SNIPPETS if s.skip}
    assert marked == SKIPPED
    assert len([s for s in ALL_SNIPPETS if not s.skip]) >= 4, "the pages lost their Python examples"


def test_skip_marker_is_read_only_right_before_a_fence() -> None:
    markdown = "text\n<!-- skip-test: needs a GPU -->\n\n```python\nx = 1\n```\n\n```python\ny = 2\n```\n"
    assert [(line, skip) for _, line, _, skip in fenced_blocks(markdown)] == [(4, "needs a GPU"), (8, None)]


@pytest.mark.parametrize("page", PAGES, ids=[page.relative_to(ROOT).as_posix() for page in PAGES])
def test_relative_links_resolve(page: Path) -> None:
    assert not broken_links(page), broken_links(page)


def test_slugs_follow_github() -> None:
    assert slug("Real data: Multi30k German → English on 2 CPU cores") == (
        "real-data-multi30k-german--english-on-2-cpu-cores"
    )
    assert slug("Greedy decoding and continuing a `generate()` call") == (
        "greedy-decoding-and-continuing-a-generate-call"
    )


def test_every_page_is_linked_from_the_readme() -> None:
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in relative_links(ROOT / "README.md")}
    assert not [page.name for page in PAGES[1:] if page not in linked]


def readme_section(heading: str) -> str:
    """The text of README.md's ``## heading`` section, up to the next ``## `` heading."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return readme.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def bash_commands(section: str) -> list[str]:
    """The last line of each bash block of a README section (the line the reader copies)."""
    return [code.splitlines()[-1] for language, _, code, _ in fenced_blocks(section) if language == "bash"]


ACTIVATE = ". .venv/bin/activate && "


def test_readme_installs_for_use_first_and_for_tests_in_contribute() -> None:
    """README command 1 (under Use) installs the `train` extra, the smallest that runs the demo, and runs
    the demo; command 2 (under Contribute) installs the dev extras itself and then runs the tests."""
    install = next(command for command in bash_commands(readme_section("Use")) if "pip install" in command)
    assert install.startswith("python3 -m venv .venv && " + ACTIVATE)
    assert install.endswith('&& pip install -e ".[train]" && python -m hf_vanilla.demo'), install
    [test] = bash_commands(readme_section("Contribute"))
    assert test.startswith(ACTIVATE + 'pip install -e ".[dev]" && ') and "python -m pytest" in test


def test_ci_runs_exactly_the_readmes_test_command() -> None:
    """`.ci/run` activates the same virtualenv, installs the dev extras, and runs the rest of README
    command 2 verbatim."""
    [test] = bash_commands(readme_section("Contribute"))
    install_dev = 'pip install -e ".[dev]" && '
    tests = test.removeprefix(ACTIVATE).removeprefix(install_dev)
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert tests in ci
    installs = [number for number, line in enumerate(ci) if line.endswith('-e ".[dev]"')]
    assert ci.index(". .venv/bin/activate") < installs[0] < ci.index(tests)


@pytest.mark.parametrize("translation", TRANSLATIONS, ids=[page.name for page in TRANSLATIONS])
def test_a_translation_has_the_same_code_and_pictures_and_links_its_original(translation: Path) -> None:
    original = TRANSLATIONS[translation]
    texts = [page.read_text(encoding="utf-8") for page in (original, translation)]
    code = [[(language, block) for language, _, block, _ in fenced_blocks(text)] for text in texts]
    assert code[0] == code[1] and len(code[0]) >= 8
    pictures = [re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text) for text in texts]
    assert pictures[0] == pictures[1]
    assert original.name in relative_links(translation) and translation.name in relative_links(original)


WALKTHROUGH = ROOT / "docs" / "walkthrough.md"

#: The concepts the walk-through explains, one section each, in this order (words of each heading).
WALKTHROUGH_SECTIONS = [
    "dot-product attention",
    "queries, keys and values",
    "multi-head",
    "positional encoding",
    "residual",
    "shifted right",
    "causal mask and the padding mask",
    "encoder-decoder attention",
]


def test_walkthrough_has_one_section_per_concept_in_order() -> None:
    headings = re.findall(r"^## (.+)$", WALKTHROUGH.read_text(encoding="utf-8"), flags=re.MULTILINE)
    numbered = [heading.lower() for heading in headings if re.match(r"\d+\. ", heading)]
    assert len(numbered) == len(WALKTHROUGH_SECTIONS)
    for heading, concept in zip(numbered, WALKTHROUGH_SECTIONS, strict=True):
        assert concept in heading, (heading, concept)


def test_walkthrough_names_code_that_exists() -> None:
    """Each section names the code that does it as a link [`symbol`](file.py): the file must define it
    (a function, a class, or an attribute set in it)."""
    text = WALKTHROUGH.read_text(encoding="utf-8")
    references = re.findall(r"\[`(\w+)`\]\(([^)#]+\.py)\)", text)
    assert len({symbol for symbol, _ in references}) >= 10
    for symbol, target in references:
        source = (WALKTHROUGH.parent / target).resolve().read_text(encoding="utf-8")
        pattern = rf"^\s*(?:def|class) {symbol}\b|^\s*(?:self\.)?{symbol}\s*[:=]"
        assert re.search(pattern, source, flags=re.MULTILINE), f"{target} does not define {symbol}"


def test_walkthrough_pictures_are_committed_small_and_all_shown() -> None:
    """The committed pictures (drawn from the real demo model by the page's one command) are all shown
    and each is a PNG under 100 kB. That the drawing code still runs is checked by the snippets, which
    draw the same pictures into the test's temporary folder."""
    shown = re.findall(r"!\[[^\]]*\]\((walkthrough/[^)]+)\)", WALKTHROUGH.read_text(encoding="utf-8"))
    committed = sorted(
        path.relative_to(WALKTHROUGH.parent).as_posix() for path in (ROOT / "docs" / "walkthrough").iterdir()
    )
    assert sorted(shown) == committed and len(committed) >= 7
    for name in committed:
        data = (WALKTHROUGH.parent / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) < 100_000, (name, len(data))


#: Pages that must read in one pass: no sentence over this many words.
ONE_PASS_PAGES = [ROOT / "README.md", ROOT / "docs" / "paper.md"]
LONGEST_SENTENCE = 40


def sentences(markdown: str) -> list[str]:
    """The prose sentences of a page: code blocks, tables and headings left out; a paragraph or a list
    item ends a sentence, as does ``.``, ``!`` or ``?`` before a space."""
    text = re.sub(r"^```.*?^```", "", markdown, flags=re.DOTALL | re.MULTILINE)
    found = []
    for paragraph in re.split(r"\n\s*\n|\n(?=\s*(?:[-*] |\d+\. ))", text):
        lines = [line for line in paragraph.splitlines() if not line.lstrip().startswith(("|", "#", "<!--"))]
        found += [s.strip() for s in re.split(r"(?<=[.!?])\s+", " ".join(lines)) if s.strip()]
    return found


def test_sentences_are_counted_by_paragraph_and_full_stop() -> None:
    page = (
        "# Title\n\nOne two. Three four five!\n- a list item\n- another\n\n| a | b |\n\n```\nx = 1. y\n```\n"
    )
    assert sentences(page) == ["One two.", "Three four five!", "- a list item", "- another"]


@pytest.mark.parametrize("page", ONE_PASS_PAGES, ids=[page.name for page in ONE_PASS_PAGES])
def test_a_page_reads_in_one_pass(page: Path) -> None:
    long = [s for s in sentences(page.read_text(encoding="utf-8")) if len(s.split()) > LONGEST_SENTENCE]
    assert not long, long


def test_readme_results_state_one_short_claim_per_row() -> None:
    """Each row of README's Results table is one claim of at most 30 words, linking to a docs page."""
    rows = [line for line in readme_section("Results").splitlines() if line.startswith("| ")][1:]
    assert len(rows) >= 5
    for row in rows:
        claim, where = (cell.strip() for cell in row.strip("|").split("|"))
        assert len(claim.split()) <= 30 and claim.count(". ") == 0 and claim.endswith("."), claim
        assert re.search(r"\]\(docs/[^)#]+\.md#[^)]+\)", where), where


#: Every page a reader opens: the README, the docs and the benchmarks' pages and code.
READER_FILES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted(path for path in (ROOT / "benchmarks").rglob("*") if path.suffix in {".md", ".py"}),
]


#: An issue's number: the word and a number, or a hash and a number (not an anchor, an upstream
#: repository's issue or an HTML entity).
ISSUE_NUMBER = re.compile(r"\bissues? \d+|(?<![\w&/])(?<!\]\()#\d+\b(?!-)", re.IGNORECASE)


def test_no_issue_numbers_in_docs_or_benchmarks() -> None:
    """Say what, not which issue: a reader cannot follow an issue number."""
    pattern = ISSUE_NUMBER
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in READER_FILES
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, found


def test_no_issue_numbers_in_code_comments_either() -> None:
    """The same rule for the code, tests, scripts and recipes: a comment says what, not which issue."""
    pattern = ISSUE_NUMBER
    files = [
        path
        for folder in ("hf_vanilla", "tests", "scripts", "recipes", "configs")
        for path in sorted((ROOT / folder).rglob("*"))
        if path.suffix in {".py", ".sh", ".md", ".yaml", ".toml"}
    ]
    assert len(files) > 100
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert not found, found


def test_paper_page_links_each_part_to_the_line_that_holds_it() -> None:
    """paper.md maps the paper to the code by links [`symbol`](file.py#Lnn): line nn of the file must name
    the symbol, so a link that a change has moved fails here (update its line number)."""
    text = (ROOT / "docs" / "paper.md").read_text(encoding="utf-8")
    links = re.findall(r"\[`(\w+)`\]\(([^)#]+\.py)#L(\d+)\)", text)
    assert len(links) >= 20
    for symbol, target, line in links:
        source = (ROOT / "docs" / target).resolve().read_text(encoding="utf-8").splitlines()
        assert re.search(rf"\b{symbol}\b", source[int(line) - 1]), f"{target}#L{line} does not hold {symbol}"


def readme_commands(heading: str) -> list[str]:
    """The shell commands of the bash blocks under README.md's ``### heading``, continuation lines joined and
    comments dropped."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split(f"\n### {heading}\n", 1)[1].split("\n##", 1)[0]
    blocks = [code for language, _, code, _ in fenced_blocks(section) if language == "bash"]
    joined = "\n".join(blocks).replace("\\\n", " ")
    return [line.split("#", 1)[0].strip() for line in joined.splitlines() if line.split("#", 1)[0].strip()]


@pytest.mark.slow
def test_readme_translation_commands_run_as_written(tmp_path: Path, model, tokenizer) -> None:
    """Each ``hf-vanilla-translate`` and ``torchrun`` command of the README's translation sections runs as
    printed, on tiny model folders named as there, and writes one output line per input line. The server's
    command runs until stopped; tests/serving starts it."""
    import os
    import subprocess

    for name in ("demo_output", "run2", "run3"):
        save_model_folder(model, tokenizer, tmp_path / name)
    for name, text in {
        "in.txt": "w4 w5\nw1 w2 w3\n",
        "mono.txt": "w7\nw6 w7\n",
        "corpus.txt": "w4\nw5\nw6\n",
    }.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    (tmp_path / "prefixes.txt").write_text("w9\n\n", encoding="utf-8")
    commands = readme_commands("Translate like an MT toolkit") + readme_commands(
        "Translate a corpus on many processes, or serve over HTTP"
    )
    run = [command for command in commands if not command.startswith("hf-vanilla-serve")]
    assert len(run) >= 4 and any(command.startswith("torchrun") for command in run), commands
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for command in run:
        for leftover in ("out.txt", "out.align", "back.txt"):
            (tmp_path / leftover).unlink(missing_ok=True)
        result = subprocess.run(
            command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert result.returncode == 0, (command, result.stderr[-3000:])
        output = re.search(r"--output_file (\S+)", command)[1]
        source = re.search(r"--input_file (\S+)", command)[1]
        assert len((tmp_path / output).read_text(encoding="utf-8").splitlines()) == len(
            (tmp_path / source).read_text(encoding="utf-8").splitlines()
        ), command
