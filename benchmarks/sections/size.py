"""Section 9 — code size (no Redis, no timing): the lines of the engine and the longest
class of the library, read from the rlocks package this run imports.

* ``rlocks/_engine``: every line (``wc -l``: blank lines and comments too) of its Python
  modules (``*.py``, recursively) and of its Lua scripts (``lua/*.lua``).
* the longest class anywhere in ``rlocks/``, by the ``ast`` module: from its ``class``
  line (decorators included) to its last statement, nested classes counted in their
  enclosing class and on their own.

Targets (issue 38): the engine <= 7,000 lines, Python and Lua together; no class longer
than 500 lines.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from . import SectionResult, Target

KEY = "size"
TITLE = "9. Code size (rlocks/_engine lines, longest class)"
ENGINE_LIMIT = 7000
CLASS_LIMIT = 500


def package_dir() -> Optional[Path]:
    """The directory of the rlocks package this interpreter imports (not imported here)."""
    spec = importlib.util.find_spec("rlocks")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def count_lines(text: str) -> int:
    """Lines as ``wc -l`` counts them, plus a last line without its newline."""
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def engine_lines(engine: Path) -> Dict[str, int]:
    """Lines of the engine's Python modules and Lua scripts."""
    py = sum(count_lines(f.read_text(encoding="utf-8")) for f in sorted(engine.rglob("*.py")))
    lua = sum(count_lines(f.read_text(encoding="utf-8"))
              for f in sorted(engine.rglob("*.lua")))
    return {"python": py, "lua": lua, "total": py + lua}


def class_lengths(source: str) -> List[Tuple[str, int, int]]:
    """(qualified name, first line, lines) of every class in ``source``."""
    out: List[Tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                last = child.end_lineno or child.lineno
                name = prefix + child.name
                out.append((name, first, last - first + 1))
                visit(child, name + ".")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, prefix + child.name + ".<locals>.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return out


def longest_classes(package: Path, top: int = 3) -> List[Dict[str, Any]]:
    """The ``top`` longest classes of every module under ``package``."""
    found: List[Dict[str, Any]] = []
    for f in sorted(package.rglob("*.py")):
        for name, line, n in class_lengths(f.read_text(encoding="utf-8")):
            found.append({"class": name, "file": str(f.relative_to(package.parent)),
                          "line": line, "lines": n})
    found.sort(key=lambda c: -c["lines"])
    return found[:top]


def size_targets(data: Dict[str, Any]) -> List[Target]:
    """Issue 38, target 7, from the section's data (pure: the self-check tests it)."""
    eng, classes = data.get("engine"), data.get("classes")
    what_e = "code size: rlocks/_engine lines, Python and Lua (issue 38)"
    what_c = "code size: longest class in rlocks/ (issue 38)"
    out = []
    if eng:
        out.append(Target(what_e, f"{eng['total']:,} (Python {eng['python']:,}, Lua "
                                  f"{eng['lua']:,})", f"<= {ENGINE_LIMIT:,}",
                          eng["total"] <= ENGINE_LIMIT))
    else:
        out.append(Target(what_e, "-", f"<= {ENGINE_LIMIT:,}", None))
    if classes:
        c = classes[0]
        out.append(Target(what_c, f"{c['lines']} ({c['class']}, {c['file']}:{c['line']})",
                          f"<= {CLASS_LIMIT}", c["lines"] <= CLASS_LIMIT))
    else:
        out.append(Target(what_c, "-", f"<= {CLASS_LIMIT}", None))
    return out


def run(ctx: Any) -> SectionResult:
    res = SectionResult(KEY, TITLE)
    package = package_dir()
    if package is None:
        res.lines.append("rlocks not found: nothing to count")
    else:
        res.data["package"] = str(package)
        res.data["engine"] = engine_lines(package / "_engine")
        res.data["classes"] = longest_classes(package)
        eng = res.data["engine"]
        res.lines.append(f"{package}/_engine: {eng['total']:,} lines (Python {eng['python']:,}, "
                         f"Lua {eng['lua']:,})")
        res.lines.append("longest classes:")
        for c in res.data["classes"]:
            res.lines.append(f"  {c['lines']:>5}  {c['class']} ({c['file']}:{c['line']})")
    res.targets += size_targets(res.data)
    return res
