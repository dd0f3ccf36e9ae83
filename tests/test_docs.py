"""The documentation runs: every code example of README.md and docs/**/*.md, with Sybil.

- A ``python`` block runs as it is, one test each, in the order of its page and in one
  namespace per page (a block may use what an earlier block of its page defined).
  ``RLOCKS_URL`` is the suite's own server (conftest), so an example that uses
  ``client=None`` or reads ``RLOCKS_URL`` talks to it.
- A ``console`` block is a transcript of the ``rlocks`` command line: each ``$ rlocks ...``
  line runs (click's CliRunner, so on the same server) and its output must be the lines
  under it, with what changes from run to run masked on both sides (owner ids, durations,
  clock times, ``*_ms`` numbers of JSON) and runs of spaces taken as one.
- ``<!-- invisible-code-block: python ... -->`` holds set-up a reader need not see (the
  holders a transcript shows); ``<!-- skip: next "why" -->`` skips the block after it.
  ``text``, ``sh`` and other blocks are not run.

Each page must leave no primitive behind in the namespaces the docs use (an example
releases what it takes), and each example must finish well within 30 s.
"""

from __future__ import annotations

import doctest
import re
import shlex
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

import pytest

sybil = pytest.importorskip("sybil")

from click.testing import CliRunner  # noqa: E402
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: The namespaces the examples use: each page must leave no key there.
DOC_NAMESPACES = ("rlocks", "shop")


# -- console transcripts ------------------------------------------------------------------

_MASKS = [
    # owner ids: host:pid:nonce:thread (or :a<task>)
    (re.compile(r"[^\s:'\"]+:\d+:[0-9a-f]{16}:a?\d+"), "<owner>"),
    (re.compile(r"\b\d\d:\d\d:\d\d\b"), "<clock>"),
    # the shortened owner of rlocks top: host:pid:thread
    (re.compile(r"\b[\w.-]+:\d+:a?\d+\b"), "<owner>"),
    (re.compile(r'("[a-z_]*_ms"): -?\d+'), r"\1: <n>"),
    (re.compile(r"(?<![\w.])(>=)?\d+(\.\d+)?s\b|\b\d+m\d\ds\b|\b\d+h\d\dm\b"), "<t>"),
]


def _normal(text: str) -> List[str]:
    lines = []
    for line in text.splitlines():
        for pattern, replacement in _MASKS:
            line = pattern.sub(replacement, line)
        line = " ".join(line.split())
        if line:
            lines.append(line)
    return lines


def _transcript(source: str) -> List[Tuple[str, str]]:
    """``$ command`` lines of a console block and the output under each."""
    steps: List[Tuple[str, str]] = []
    for line in source.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], ""))
        elif steps:
            command, output = steps[-1]
            steps[-1] = (command, output + line + "\n")
        elif line.strip():
            raise ValueError(f"output before any command: {line!r}")
    return steps


def run_console(example: Any) -> Optional[str]:
    from rlocks.cli import cli

    runner = CliRunner()
    for command, expected in _transcript(example.parsed):
        words = shlex.split(command, comments=True)
        stdin = None
        if words[-2:] == ["<", "/dev/null"]:
            words, stdin = words[:-2], ""
        if words[0] != "rlocks":
            return f"only rlocks commands can be checked, not {command!r}"
        result = runner.invoke(cli, words[1:], input=stdin)
        if _normal(result.output) != _normal(expected):
            checker = doctest.OutputChecker()
            diff = checker.output_difference(
                doctest.Example(command, "\n".join(_normal(expected)) + "\n"),
                "\n".join(_normal(result.output)) + "\n", doctest.REPORT_NDIFF)
            return f"$ {command}\n{diff}"
    return None


SYBIL = sybil.Sybil(
    parsers=[
        PythonCodeBlockParser(),
        CodeBlockParser(language="console", evaluator=run_console),
        SkipParser(),
    ],
    path="..",
)


# -- the pages, run in order ----------------------------------------------------------------


class Page:
    """One page's examples, run in order however the tests are selected."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = str(path.relative_to(ROOT))
        self.examples = list(SYBIL.parse(path))
        self.done = 0
        self.keys_before: Optional[Set[bytes]] = None
        runnable = [i for i, e in enumerate(self.examples) if not _directive(e)]
        self.last = runnable[-1] if runnable else -1

    def run_through(self, index: int, client: Any) -> None:
        if self.keys_before is None:
            self.keys_before = _doc_keys(client)
        while self.done < index:  # the blocks before it (when it runs alone)
            example = self.examples[self.done]
            self.done += 1
            try:
                example.evaluate()
            except Exception as exc:  # noqa: BLE001 - a skip, or a failure of its own test
                if type(exc).__name__ != "SkipTest":
                    raise
        self.done = index + 1
        started = time.monotonic()
        self.examples[index].evaluate()
        took = time.monotonic() - started
        assert took < 30, f"{self.name}: an example took {took:.1f} s (keep them quick)"
        if index == self.last:
            left = _doc_keys(client) - self.keys_before
            assert not left, f"{self.name} left keys behind (release what it takes): {left}"


def _directive(example: Any) -> bool:
    """A ``skip:`` comment (its parsed form is its arguments; a block's is its source)."""
    return not isinstance(example.parsed, str)


def _doc_keys(client: Any) -> Set[bytes]:
    keys: Set[bytes] = set()
    for namespace in DOC_NAMESPACES:
        for key in client.scan_iter(match=f"{namespace}:*"):
            if b":fence:{" not in key and not key.endswith(b":wait-seq"):
                keys.add(key)
    return keys


PAGE_OBJECTS: Dict[str, Page] = {}
CASES: List[Any] = []
for _path in PAGES:
    _page = Page(_path)
    PAGE_OBJECTS[_page.name] = _page
    for _index, _example in enumerate(_page.examples):
        if not _directive(_example):
            CASES.append(pytest.param(_page.name, _index, id=f"{_page.name}:{_example.line}"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("page", "index"), CASES)
def test_example(page: str, index: int, client: Any) -> None:
    PAGE_OBJECTS[page].run_through(index, client)


# -- what the examples must be ---------------------------------------------------------------


def _python_blocks() -> List[Tuple[str, int, str]]:
    found = []
    for page in PAGE_OBJECTS.values():
        for example in page.examples:
            if isinstance(example.parsed, str) and example.region.evaluator is not run_console:
                found.append((page.name, example.line, example.parsed))
    return found


def test_the_pages_have_examples() -> None:
    counts = {name: sum(1 for c in CASES if c.values[0] == name) for name in PAGE_OBJECTS}
    assert counts["README.md"] >= 2, counts
    assert sum(counts.values()) >= 30, counts


def test_every_coroutine_an_example_defines_is_run() -> None:
    # An `async def main()` that nothing runs passes silently: the old Quick start's did.
    for name, line, source in _python_blocks():
        if "async def" in source:
            assert "asyncio.run(" in source, f"{name}:{line} defines a coroutine it never runs"


# -- the ACL lines ----------------------------------------------------------------------------


def _acl_lines(path: Path) -> Dict[str, List[str]]:
    lines: Dict[str, List[str]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        words = line.split()
        if words[:2] == ["ACL", "SETUSER"]:
            assert words[2] not in lines, f"{path.name}: two ACL lines for {words[2]}"
            lines[words[2]] = words[3:]
    return lines


def test_the_acl_lines_are_the_ones_the_suite_proves() -> None:
    """docs/operations.md and the README give the same two lines; the library line is
    exactly what tests/test_security.py grants (and proves enough), and the operator's
    line adds to it what the command line reads with (tests/test_api.py runs both)."""
    from .test_security import ACL_NAMESPACE, ACL_RULES

    docs = _acl_lines(ROOT / "docs" / "operations.md")
    readme = _acl_lines(ROOT / "README.md")
    assert set(docs) == {"rlocks", "rlocks-ops"}
    assert readme == docs
    proven = [rule.replace(f"{ACL_NAMESPACE}:*", "rlocks:*") for rule in ACL_RULES]
    library = [word for word in docs["rlocks"] if word != ">PASSWORD"]
    assert library == proven
    operator = [word for word in docs["rlocks-ops"] if word != ">PASSWORD"]
    assert operator[:len(library)] == library
