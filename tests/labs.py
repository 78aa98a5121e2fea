"""The labs: the functions of a step a learner writes, and the step's own tests that judge them.

    python -m tests.labs 02                # what `make lab STEP=02` runs: labs/step02.py
    python -m tests.labs 02 --reference    # the reference's own functions, through the same switch
    python -m tests.labs --check           # every lab, stubs and reference, in one process (JSON)

A lab names, for one step, the one or two functions that carry its idea (``targets``)
and the tests of that step that exercise them (``tests``). ``pytest --lab 02`` (see
``tests/conftest.py``) sets each function of ``labs/step02.py`` in place of the
reference one on the class or module that owns it, for the whole run, keeps only the
lab's tests, and ends with a summary (``tests/lab_report.py``): for each failing test,
what must hold in words, what broke with its numbers, and Hypothesis's smallest
example in full. ``tests/lab_mistakes/`` holds the mistakes learners make, each planted
in an otherwise right answer; ``--check`` runs them too.

There is one implementation, the reference in ``paged/``; a lab file holds only the
learner's version of a few functions. ``--lab-source reference`` runs the reference's
functions through the same switch, so ``tests/test_labs.py`` can prove, for every lab,
that the stubs fail and the reference passes.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Lab:
    """One lab: what the learner writes and which tests judge it.

    Attributes:
        title: what the lab builds, in a few words.
        targets: ``(module, attribute path in it, name in labs/stepNN.py)`` per function.
        tests: the node ids (a file, or ``file::test``) of the step's tests that run.
    """

    title: str
    targets: tuple[tuple[str, str, str], ...]
    tests: tuple[str, ...]


LABS: dict[str, Lab] = {
    "01": Lab(
        "the free list and reference counts (allocate, decref, free)",
        (("paged.step01_allocator.allocator", "BlockAllocator.allocate", "allocate"),
         ("paged.step01_allocator.allocator", "BlockAllocator.decref", "decref"),
         ("paged.step01_allocator.allocator", "BlockAllocator.free", "free")),
        ("tests/step01_allocator/test_allocator.py",),
    ),
    "02": Lab(
        "a block table: append on demand, and the slot mapping",
        (("paged.step02_block_table.block_table", "BlockTable.append", "append"),
         ("paged.step02_block_table.block_table", "BlockTable.slot", "slot")),
        ("tests/step02_block_table/test_block_table.py",),
    ),
    "03": Lab(
        "block-wise attention with an online softmax, walking the block table",
        (("paged.step03_attention.blockwise", "_one_sequence", "attend_one_sequence"),),
        ("tests/step03_attention/test_attention_paths.py::test_blockwise_equals_contiguous_toleranced",
         "tests/step03_attention/test_attention_paths.py::test_paged_attention_mixed_batch_equals_contiguous"
         "[blockwise]"),
    ),
    "04": Lab(
        "sharing blocks: fork, and copy-on-write on the first write",
        (("paged.step04_sharing.cow_table", "CowBlockTable.fork", "fork"),
         ("paged.step04_sharing.cow_table", "CowBlockTable.append", "append")),
        ("tests/step04_sharing/test_cow_table.py",
         "tests/step04_sharing/test_sharing_stateful.py",
         "tests/step04_sharing/test_scheduler_rules.py::test_rule_a_group_computes_its_prompt_once_and_forks"),
    ),
    "05": Lab(
        "preemption: how a victim makes room, and its blocks moved to host memory and back",
        (("paged.step05_preemption.policy", "Preemption.choose", "choose"),
         ("paged.step05_preemption.kv_manager", "SwappingKVManager._move", "_move")),
        ("tests/step05_preemption/test_scheduler_rules.py",
         "tests/step05_preemption/test_scheduler_stateful.py::test_scheduler_state_machine_model_free"),
    ),
    "06": Lab(
        "the column and row split of a linear layer's weight",
        (("paged.step06_tensor_parallel.sharding", "column_reads", "column_reads"),
         ("paged.step06_tensor_parallel.sharding", "row_reads", "row_reads")),
        ("tests/step06_tensor_parallel/test_sharding.py::test_each_rank_loads_exactly_its_slices_bitwise",
         "tests/step06_tensor_parallel/test_sharding_property.py::test_w_shards_combined_equal_the_unsharded_model"),
    ),
}


def get(step: str) -> Lab:
    """The lab of ``step`` (``"2"``, ``"02"`` or ``"step02"``), or a ValueError listing the labs."""
    key = str(step).removeprefix("step").zfill(2)
    if key not in LABS:
        raise ValueError(f"no lab for step {step!r}: the labs are {', '.join(sorted(LABS))} "
                         "(make lab STEP=NN)")
    return key, LABS[key]


def _owner(module: str, path: str):
    """The object that holds the last name of ``path`` in ``module``, and that name."""
    owner = importlib.import_module(module)
    *outer, name = path.split(".")
    for part in outer:
        owner = getattr(owner, part)
    return owner, name


def _learner_module(key: str, source: str):
    """``labs/stepNN.py`` (source ``labs``) or the Python file at ``source``."""
    path = ROOT / "labs" / f"step{key}.py" if source == "labs" else Path(source)
    if not path.is_file():
        raise ValueError(f"lab {key}: no file {path} (the lab files are labs/stepNN.py)")
    spec = importlib.util.spec_from_file_location(f"_lab_step{key}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, path


def install(step: str, source: str = "labs") -> tuple[str, Lab, str]:
    """Put the lab's functions in place of the reference ones; return ``(key, lab, where from)``.

    ``source``: ``labs`` (``labs/stepNN.py``), ``reference`` (the reference's own functions,
    set back in place through the same path), or a path to a Python file.
    """
    key, lab = get(step)
    owners = [(_owner(module, path), name) for module, path, name in lab.targets]
    if source == "reference":
        functions = [vars(owner)[attr] for (owner, attr), _ in owners]
        origin = "the reference in paged/"
    else:
        module, path = _learner_module(key, source)
        missing = [name for _, name in owners if not callable(getattr(module, name, None))]
        if missing:
            raise ValueError(f"lab {key}: {path} defines no {', '.join(missing)} (the functions it must hold: "
                             f"{', '.join(name for _, name in owners)})")
        functions = [_returns_something(getattr(module, name), vars(owner)[attr], f"{path.name}: {name}")
                     for (owner, attr), name in owners]
        origin = str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    for ((owner, attr), _), function in zip(owners, functions):
        _replaced.append((owner, attr, vars(owner)[attr]))
        setattr(owner, attr, function)
    return key, lab, origin


def _returns_something(function, reference, name: str):
    """``function``, refusing to return None where the reference it replaces returns a value.

    A stub or a forgotten ``return`` gives None, and the caller fails far away (``'NoneType' object
    is not iterable`` in the scheduler); this says at once which function and what it must return.
    """
    returns = inspect.signature(reference).return_annotation
    if returns in (None, "None", inspect.Signature.empty):
        return function

    @functools.wraps(function)
    def checked(*args, **kwargs):
        result = function(*args, **kwargs)
        if result is None:
            raise TypeError(f"{name} returned None; it must return {returns} (a `return` missing?)")
        return result

    return checked


_replaced: list = []  # (owner, name, the reference's function), most recent last


def uninstall() -> None:
    """Put every reference function ``install`` replaced back (the end of a lab's run)."""
    while _replaced:
        owner, attr, function = _replaced.pop()
        setattr(owner, attr, function)


def selected(nodeid: str, lab: Lab) -> bool:
    """Whether the test ``nodeid`` is one of the lab's (a whole file, a test, or a test's case)."""
    return any(nodeid == t or nodeid.startswith(t + "::") or nodeid.startswith(t + "[") for t in lab.tests)


def _pytest_args(key: str, source: str) -> list[str]:
    files = sorted({t.split("::")[0] for t in LABS[key].tests})
    # schemathesis's pytest plugin (the server's fuzz tests use schemathesis without it) blanks every
    # argument of Hypothesis's failing example ("batch=,"): a lab needs the arguments in full.
    # -rN: the lab prints its own summary; pytest's (untruncated where CI is set) would repeat the raw one
    return [*files, f"--lab={key}", f"--lab-source={source}", "-p", "no:cacheprovider", "-p", "no:schemathesis",
            "-q", "--tb=no", "-rN"]


MISTAKES = ROOT / "tests" / "lab_mistakes"  # a learner's answer with one planted mistake per file


def mistakes(key: str) -> list[Path]:
    """The planted-mistake files of lab ``key`` (``tests/lab_mistakes/stepNN_*.py``)."""
    return sorted(MISTAKES.glob(f"step{key}_*.py"))


def check(keys: list[str]) -> dict:
    """Every lab of ``keys`` in this one process: with its stubs, with each planted mistake (both
    stopping at the first failure) and with the reference. Returns ``{key: {"labs" | "reference":
    {"rc", "output"}, "mistakes": {file stem: {"rc", "output"}}}}``.

    What ``tests/test_labs.py`` reads: one interpreter, so torch, Hypothesis and the test modules
    are imported once instead of once per run.
    """
    import contextlib
    import io

    import pytest

    results: dict = {}
    for key in keys:
        runs = [("labs", "labs", ["-x"]), ("reference", "reference", [])]
        runs += [(path.stem, str(path), ["-x"]) for path in mistakes(key)]
        for name, source, extra in runs:
            out = io.StringIO()
            try:
                with contextlib.redirect_stdout(out):
                    rc = int(pytest.main([*_pytest_args(key, source), *extra]))
            finally:
                uninstall()  # the next run starts from the reference, whatever happened
            where = results.setdefault(key, {"mistakes": {}})
            (where if name in ("labs", "reference") else where["mistakes"])[name] = {
                "rc": rc, "output": out.getvalue()}
    return results


def main(argv: list[str]) -> int:
    import pytest

    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    if argv[0] == "--check":  # python -m tests.labs --check [NN ...]: JSON on stdout (tests/test_labs.py)
        import json

        try:
            keys = [get(step)[0] for step in argv[1:]] or sorted(LABS)
        except ValueError as err:
            print(err, file=sys.stderr)
            return 2
        results = check(keys)
        print(json.dumps(results))
        return 0
    step, rest = argv[0], argv[1:]
    try:
        key, lab = get(step)
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    source = "reference" if "--reference" in rest else "labs"
    return int(pytest.main([*_pytest_args(key, source), *[a for a in rest if a != "--reference"]]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
