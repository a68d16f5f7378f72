"""The package's layout stays as docs/architecture.md states it: every file listed, no unused code,
layers that never import upward; docs/internals.md names only symbols, files and tests that exist."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import itertools
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from tests.dead_code_allowlist import USED_FROM_OUTSIDE
from tests.helpers import ROOT


def test_the_package_holds_no_unused_code() -> None:
    """vulture finds no unused function, class, variable, attribute or import in ``hf_vanilla/``, apart
    from the names that users or other libraries call (tests/dead_code_allowlist.py, each with its reason).
    New unused code is named in the failure: remove it, or allow its name there with the reason."""
    done = subprocess.run(
        [sys.executable, "-m", "vulture", "hf_vanilla", "--ignore-names", ",".join(USED_FROM_OUTSIDE)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0 and not done.stderr, f"unused code:\n{done.stdout}{done.stderr}"


def test_the_layers_never_import_upward() -> None:
    """import-linter keeps pyproject.toml's contracts: cli on top, the roles below it, io and the model
    files at the bottom, and the model-folder files importing nothing of hf_vanilla but each other.
    A broken contract is named in the failure with the import that breaks it."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as lint; sys.exit(lint())",
         "--no-cache"],
        capture_output=True, text=True, cwd=ROOT, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


# --------------------------------------------------------------------------------------------------
# docs/architecture.md lists every file of the package
# --------------------------------------------------------------------------------------------------
#: Where a file line's name ends and its description starts; deeper lines continue a description.
_CONTINUATION_INDENT = 20


def _listed_package_files(markdown: str) -> tuple[set[str], set[str], list[str]]:
    """The files and folders under ``hf_vanilla/`` that the Files block of docs/architecture.md lists (a
    folder's line stands for its ``__init__.py``), and the lines without a description."""
    block = markdown.split("## Files", 1)[1].split("```", 2)[1]
    lines = block.splitlines()
    start = lines.index("hf_vanilla/")
    files: set[str] = set()
    folders = {"hf_vanilla"}
    undescribed: list[str] = []
    parents: list[tuple[int, str]] = [(0, "hf_vanilla")]
    for line in itertools.takewhile(lambda line: not line or line[0] == " ", lines[start + 1 :]):
        indent = len(line) - len(line.lstrip())
        if not line.strip() or indent >= _CONTINUATION_INDENT:
            continue
        name, _, description = line.strip().partition(" ")
        if not description.strip():
            undescribed.append(line)
        while parents[-1][0] >= indent:
            parents.pop()
        path = f"{parents[-1][1]}/{name.rstrip('/')}"
        if name.endswith("/"):
            folders.add(path)
            parents.append((indent, path))
        else:
            files.add(path)
    return files, folders, undescribed


def test_the_architecture_page_lists_every_file_of_the_package() -> None:
    """docs/architecture.md has one line, with a description, for each file of ``hf_vanilla/`` and for
    nothing else: a file added or removed without its line fails here, named."""
    files, folders, undescribed = _listed_package_files((ROOT / "docs" / "architecture.md").read_text())
    present = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "hf_vanilla").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    covered = files | {f"{folder}/__init__.py" for folder in folders}
    assert not undescribed, f"lines without a description: {undescribed}"
    assert sorted(present - covered) == [], "files of hf_vanilla/ without their line in docs/architecture.md"
    assert sorted(files - present) == [], "files docs/architecture.md lists that do not exist"
    missing_folders = sorted(folder for folder in folders if not (ROOT / folder).is_dir())
    assert missing_folders == [], "folders docs/architecture.md lists that do not exist"


# --------------------------------------------------------------------------------------------------
# docs/internals.md names only what exists
# --------------------------------------------------------------------------------------------------
_MISSING = object()


def _subclasses(cls: type) -> list[type]:
    found, todo = [], list(cls.__subclasses__())
    while todo:
        sub = todo.pop()
        found.append(sub)
        todo += sub.__subclasses__()
    return found


def _source(cls: type) -> str:
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):  # builtins, classes made at run time
        return ""


def _attribute(owner: object, name: str) -> object:
    """``owner.name``: an attribute, a submodule, an attribute that the class's code sets on its instances,
    or a hook that a subclass in hf_vanilla defines (transformers looks these up by name)."""
    found = getattr(owner, name, _MISSING)
    if found is _MISSING and isinstance(owner, ModuleType):
        try:
            found = importlib.import_module(f"{owner.__name__}.{name}")
        except ImportError:
            found = _MISSING
    if found is _MISSING and isinstance(owner, type):
        assigned = re.compile(rf"self\.{re.escape(name)}\b|[\"']{re.escape(name)}[\"']")
        if any(assigned.search(_source(cls)) for cls in owner.__mro__):
            found = name  # an attribute its instances set
        hooks = [sub for sub in _subclasses(owner) if sub.__module__.startswith("hf_vanilla.")]
        found = next((vars(sub)[name] for sub in hooks if name in vars(sub)), found)
    return found


def _hf_vanilla_modules(name: str) -> list[ModuleType]:
    """The modules of hf_vanilla called ``name``, or that define ``name`` at their top level."""
    found = []
    for path in sorted((ROOT / "hf_vanilla").rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        defines = re.search(
            rf"^(class|def) {re.escape(name)}\b|^{re.escape(name)}\s*(:[^=]*)?=", source, re.M
        )
        if path.stem == name or defines:
            module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
            found.append(module if path.stem == name else getattr(module, name))
    return found


def _roots(name: str) -> Iterator[object]:
    """What the first part of a dotted name can stand for: torch, transformers or one of their modules,
    a class of theirs, a builtin; then a module or top-level name of hf_vanilla (imported only then)."""
    import torch
    import transformers
    from transformers import cache_utils

    yield from (module for module in (torch, transformers) if module.__name__ == name)
    for namespace in (builtins, transformers, cache_utils, torch.nn):
        found = getattr(namespace, name, _MISSING)
        if found is not _MISSING:
            yield found
    yield from _hf_vanilla_modules(name)


def _resolves(name: str) -> bool:
    first, *rest = name.split(".")
    for root in _roots(first):
        owner = root
        for part in rest:
            owner = _attribute(owner, part)
            if owner is _MISSING:
                break
        else:
            return True
    return False


def _expanded(span: str) -> list[str]:
    """``a_{b,c}_d`` → ``a_b_d``, ``a_c_d``."""
    braces = re.search(r"\{([^}]*)\}", span)
    if not braces:
        return [span]
    return [
        name
        for choice in braces.group(1).split(",")
        for name in _expanded(span[: braces.start()] + choice + span[braces.end() :])
    ]


def _test_exists(span: str) -> bool:
    """``test_x.py``, ``test_x.py::test_name[params]`` or ``test_x.py[params]``: the file is in tests/,
    and the test function in it."""
    file, _, test = re.sub(r"\[.*\]$", "", span).partition("::")
    paths = list((ROOT / "tests").rglob(Path(file).name))
    test = re.sub(r"\[.*\]$", "", test)
    return any(
        not test or re.search(rf"^def {re.escape(test)}\(", path.read_text(), re.MULTILINE) for path in paths
    )


def _unresolved(markdown: str) -> list[str]:
    unresolved = []
    for span in re.findall(r"`([^`]+)`", markdown):
        if span.startswith(('"', "'")):
            continue  # a string value
        if re.match(r"^(tests/.*/)?test_\w+\.py", span):
            exists = _test_exists(span)
        elif span.endswith(".py"):
            exists = (ROOT / span).is_file() or any((ROOT / "hf_vanilla").rglob(span))
        elif re.fullmatch(r"[A-Za-z_][\w.{},]*(\(.*\))?", span):
            exists = all(_resolves(name) for name in _expanded(re.sub(r"\(.*\)$", "", span)))
        else:
            exists = False
        if not exists:
            unresolved.append(span)
    return unresolved


def test_the_internals_page_names_only_what_exists() -> None:
    """Every code name in docs/internals.md resolves: private transformers and torch symbols (a hook
    transformers looks up by name resolves where hf_vanilla's class defines it), hf_vanilla's classes and
    functions (``fast_paths.linear``: a module of the package and a name in it), files and tests."""
    assert _unresolved((ROOT / "docs" / "internals.md").read_text()) == []


def test_a_misnamed_symbol_is_reported() -> None:
    """The check above can fail: a module, attribute, file or test that does not exist is reported."""
    wrong = "`durability.PaperSeq2SeqTrainer` `Trainer._no_such_hook` `hub.py` `test_modeling.py::test_none`"
    assert _unresolved(wrong + " `trainer.PaperSeq2SeqTrainer` `Trainer._save_checkpoint`") == [
        "durability.PaperSeq2SeqTrainer",
        "Trainer._no_such_hook",
        "hub.py",
        "test_modeling.py::test_none",
    ]


# --------------------------------------------------------------------------------------------------
# one home for each concept
# --------------------------------------------------------------------------------------------------
#: How code spells a checkpoint's folder name or its trainer state file, outside the helpers that do it.
_CHECKPOINT_SPELLINGS = re.compile(
    r"\"trainer_state\.json\"|checkpoint-\{|checkpoint-\(|PREFIX_CHECKPOINT_DIR"
)


def test_checkpoint_names_are_spelled_in_one_module() -> None:
    """``checkpoint-<step>`` names and ``trainer_state.json`` are written out only in
    hf_vanilla/io/checkpoints.py; every other module makes, reads and matches them through its names, so
    a run's checkpoints are named, found and ordered one way."""
    home = ROOT / "hf_vanilla" / "io" / "checkpoints.py"
    spelled = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "hf_vanilla").rglob("*.py"))
        if path != home
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if _CHECKPOINT_SPELLINGS.search(line)
    ]
    assert spelled == [], "checkpoint names spelled outside hf_vanilla/io/checkpoints.py"


def _defines(module: str) -> set[str] | None:
    """The names module ``module`` of the repository defines at its top level (``None``: no such file)."""
    path = ROOT / Path(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    if not path.is_file():
        return None
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def test_names_are_imported_from_the_module_that_defines_them() -> None:
    """No module serves another's names (no re-export under an old name): every ``from hf_vanilla.X import
    name`` in the package, tests, scripts and benchmarks names the module that defines ``name`` (or its
    sub-module)."""
    elsewhere = []
    for path in sorted(
        p
        for folder in ("hf_vanilla", "tests", "scripts", "benchmarks")
        for p in (ROOT / folder).rglob("*.py")
    ):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (
                isinstance(node, ast.ImportFrom)
                and node.level == 0
                and (node.module or "").startswith("hf_vanilla.")
            ):
                continue
            defined = _defines(node.module)
            for alias in node.names:
                if (
                    defined is not None
                    and alias.name not in defined
                    and _defines(f"{node.module}.{alias.name}") is None
                ):
                    elsewhere.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.module}.{alias.name}")
    assert elsewhere == [], "names imported from a module that does not define them"
