"""What a lab run tells the learner: for each failing test, the invariant in words, and the example.

``pytest --lab NN`` (``tests/conftest.py``) hands every failed test's exception here
(``describe``) and prints the lab's summary at the end of the run (``write_summary``):

* **what must hold** — the docstrings, in words, of the test functions the failure went
  through, outermost first: the test (or the state machine's rule or invariant), then the
  helper that checked (``check_allocator``, ``_unchanged_after`` …). Every test a lab runs
  says in its docstring what it checks, so this line is never a bare function name;
* **what broke** — the assertion's own message (the numbers that disagree), without
  pytest's ``assert … where …`` rewriting, which names objects rather than values;
* **your code** — the line of the learner's file that raised, when one did;
* **the smallest example** — Hypothesis's shrunk counterexample as it prints it: the
  arguments of a property test, or the calls of a state machine, without the invariant
  checks between the calls (they all passed but the last) and without the "explain"
  notes (the lab profile turns that phase off, so every argument is printed in full).
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from hypothesis.stateful import INVARIANT_MARKER

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
# files of the lab machinery itself: never "what must hold"
# the files whose functions say what must hold: the tests, and the checks they share
CHECKS = (TESTS / "invariants.py", TESTS / "attention_rows.py")


@functools.lru_cache(maxsize=None)
def _functions(path: Path) -> list[tuple[int, int, str, str]]:
    """``(first line, last line, name, first paragraph of the docstring)`` of every function in ``path``."""
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node) or ""
            paragraph = " ".join(doc.split("\n\n")[0].split())
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            out.append((first, node.end_lineno, node.name, paragraph))
    return out


def enclosing(path: Path, line: int) -> tuple[str, str] | None:
    """The innermost function of ``path`` holding ``line`` (1-based): ``(name, docstring paragraph)``."""
    found = [f for f in _functions(path) if f[0] <= line <= f[1]]
    if not found:
        return None
    first, _, name, doc = max(found, key=lambda f: f[0])
    return name, doc


def _test_frames(traceback) -> list:
    """The traceback's entries in the project's test files and shared checks (not the harnesses)."""
    out = []
    for entry in traceback:
        path = Path(str(entry.path)).resolve()
        if path.is_relative_to(TESTS) and (path.name.startswith("test_") or path in CHECKS):
            out.append((entry, path))
    return out


def _message(error: BaseException) -> list[str]:
    """The assertion's own words: pytest's ``assert x == y / + where`` lines dropped when a message exists."""
    lines = [line.rstrip() for line in str(error).strip().splitlines() if line.strip()]
    if isinstance(error, AssertionError) and lines and not lines[0].startswith("assert "):
        cut = next((i for i, line in enumerate(lines) if line.startswith("assert ")), len(lines))
        lines = lines[:cut]
    lines = [line for line in lines if not line.lstrip().startswith("+  where")]
    return lines[:8]


_DRAW_NOTE = re.compile(r"\s+# or any other generated value$")


def _example(notes: list[str], invariants: set[str]) -> list[str]:
    """Hypothesis's notes as the learner reads them: the failing example only."""
    lines = []
    for note in notes:
        for line in note.splitlines():
            if line.strip() == "Explanation:":
                break  # the explain phase's coverage notes follow: not the example
            call = re.fullmatch(r"\s*state\.(\w+)\(\)", line)
            if call and call.group(1) in invariants:
                continue  # an invariant checked between the calls
            if line.strip() and line.strip() not in ("Failing test case: <state machine>", "state.teardown()"):
                lines.append(_DRAW_NOTE.sub("", line.rstrip()))
    return _join_open_brackets(lines)


def _join_open_brackets(lines: list[str]) -> list[str]:
    """A long list printed one item per line (``Draw 3: [1,`` / ``0,`` …) back on one line."""
    out: list[str] = []
    depth = 0
    for line in lines:
        if depth > 0:
            out[-1] += " " + line.strip()
        else:
            out.append(line)
        depth += line.count("[") - line.count("]")
        depth = max(depth, 0)
    return out


def describe(item, call) -> dict:
    """One failed test of a lab run, as the summary prints it."""
    error = call.excinfo.value
    frames = _test_frames(call.excinfo.traceback)
    holds, chain = [], []
    for entry, path in frames:
        found = enclosing(path, entry.lineno + 1)
        if found is None or found[0] in chain:
            continue
        chain.append(found[0])
        # a helper (``_name``) speaks only where it checks: not a setup helper the error passed through
        checks = str(entry.statement).lstrip().startswith(("assert", "with pytest.raises"))
        if found[1] and path != TESTS / "attention_rows.py" and (checks or not found[0].startswith("_")):
            holds.append(found[1])
    last = frames[-1] if frames else None
    where = None
    if last is not None:
        entry, path = last
        where = f"{' → '.join(chain)} ({path.relative_to(ROOT)}, line {entry.lineno + 1})"
    mine = next((e for e in reversed(call.excinfo.traceback)
                 if Path(str(e.path)).resolve() == getattr(item.config, "_lab_file", None)), None)
    return {
        "test": item.nodeid,
        "holds": holds,
        "where": where,
        "error": type(error).__name__,
        "message": _message(error),
        "mine": f"{Path(str(mine.path)).name}, line {mine.lineno + 1}, in {mine.name}" if mine else None,
        "example": _example([n for n in getattr(error, "__notes__", []) if n.strip()], _machine_invariants(item)),
    }


def _machine_invariants(item) -> set[str]:
    """The invariant names of the state machine behind a ``runTest`` item (empty for other tests)."""
    case = getattr(item, "cls", None)  # a machine's TestCase is ``Machine.TestCase``, bound in the test module
    if case is None or not case.__qualname__.endswith(".TestCase"):
        return set()
    machine = getattr(item.module, case.__qualname__.split(".")[0], None)
    return {name for name in dir(machine) if getattr(getattr(machine, name), INVARIANT_MARKER, None)}


def write_summary(write, key: str, origin: str, functions: list[str], failures: list[dict],
                  passed: bool) -> None:
    """The lab's summary, one block per failing test (``write`` prints one line)."""
    write(f"your functions, from {origin}: {', '.join(functions)}")
    if not failures and passed:
        write(f"every invariant holds: lab {key} passes.")
        return
    for f in failures:
        write("")
        write(f"FAILED {f['test']}")
        for i, words in enumerate(f["holds"] or ["(the test says nothing more than its name)"]):
            write(f"  {'what must hold: ' if i == 0 else '           and: '}{words}")
        write(f"  what broke: {f['error']}: " + ("\n      ".join(f["message"]) or "(no message)"))
        if f["where"]:
            write(f"  checked in: {f['where']}")
        if f["mine"]:
            write(f"  raised in your code: {f['mine']}")
        if f["example"]:
            write("  the smallest example that breaks it (Hypothesis, shrunk):")
            for line in f["example"]:
                write(f"    {line}")
