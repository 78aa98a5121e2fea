"""The labs' switch is sound: for every lab, the stubs fail and the reference passes.

``python -m tests.labs NN`` (``make lab STEP=NN``) runs step NN's tests with the
functions of ``labs/stepNN.py`` in place of the reference ones; ``--reference`` puts
the reference's own functions through the same switch. ``python -m tests.labs --check``
does both for every lab in one subprocess (torch, Hypothesis and the test modules are
imported once, not once per run) and reports each run's exit status and summary; the
cases below read that report:

* the committed stubs must fail, and the summary must name the test and the invariant
  or rule that broke (a lab that passes with stubs teaches nothing);
* the reference must pass (otherwise the switch, not the learner, is wrong);
* each mistake learners make, planted in an otherwise right answer (``tests/lab_mistakes/``),
  must fail with a message a learner can act on: the invariant in words ("what must hold"),
  the numbers that disagree ("what broke"), and the example in full — no ``batch=,``, no
  teardown error in place of the invariant that broke.

A learner who solves a lab makes the first case fail for it: that is the lab passing
(``git checkout labs/stepNN.py`` brings the stub back). The stub runs stop at the first
failing test (``-x``), and the subprocess uses the ``labcheck`` profile (8 examples per
property: the ordinary suite runs the same tests in full on the reference).
"""

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import labs

ROOT = Path(__file__).resolve().parent.parent


def run_labs(*args: str) -> subprocess.CompletedProcess:
    # the suite runs these tests in full on the reference; through the switch, fewer examples do
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HYPOTHESIS_PROFILE": "labcheck"}
    return subprocess.run([sys.executable, "-m", "tests.labs", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def report():
    """``{key: {"labs" | "reference": {"rc", "output"}}}`` for every lab, from one subprocess."""
    done = run_labs("--check")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


# per planted mistake: (what must hold, what broke, the example), each a piece of the summary's text
MISTAKES = {
    "step01_decref_forgets_the_free_list": (
        "what must hold: A request ending drops all its entries: then every block is free.",
        "what broke: AssertionError: every entry dropped, yet only 1 of 2 blocks are free",
        "state.release_everything()"),
    "step02_slot_forgets_the_block_size": (
        "the token at position p sits in slot blocks[p // B] * B + p % B",
        "what broke: AssertionError: slot(0) = 1; position 0 is in logical block 0 (physical 1) at offset 0, "
        "so its slot is 1 * 2 + 0 = 2",
        "Draw 1 (B): 2"),
    "step03_no_causal_mask": (
        "what must hold: The block-wise attention of every row",
        "wrong: sequence 0 (prompt rows: 2 queries over 2 keys): wrong at position 0",
        "batch=Batch(block_size=2, heads=1, kv_heads=1, context_lens=[2], query_lens=[2]"),
    "step04_copy_on_empty_append": (
        "what must hold: ``append(0)`` on a table whose last block is shared and open takes no block",
        "what broke: AssertionError: append(0) copied the shared block",
        None),
    "step04_missing_decref": (
        "drops its reference on the old block, which only the parent maps now (count 1)",
        "has reference count 2; only the parent maps it now, so it must be 1 (the child's decref is missing?)",
        None),
    "step05_move_copies_shared_blocks_twice": (
        "what must hold: G (2 sequences over 3 distinct blocks) is swapped out beside A.",
        "map 4 distinct host blocks; they share their prompt's blocks, so 3",
        None),
    "step06_column_reads_the_first_rows": (
        "what must hold: Rank r of W holds, bitwise, rows r/W of each part of a column-parallel weight",
        "rank 1 of 2: model.layers.0.self_attn.qkv_proj.weight (64, 64) is not the checkpoint's slice",
        None),
}


def _summary(run: dict, key: str) -> str:
    return run["output"][run["output"].index(f"lab {key}: "):]


@pytest.mark.parametrize("key", sorted(labs.LABS))
def test_lab_stubs_fail_naming_the_invariant(report, key):
    run = report[key]["labs"]
    assert run["rc"] == 1, f"lab {key}'s stubs did not fail:\n{run['output'][-3000:]}"
    summary = _summary(run, key)
    assert "FAILED tests/step" in summary and "what must hold: " in summary and "what broke: " in summary, summary
    assert "(the test says nothing more than its name)" not in summary, summary
    assert f"labs/step{key}.py" in summary, summary
    assert "slowest" not in run["output"], "a lab prints no durations"


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_lab_planted_mistake_fails_with_a_message_a_learner_understands(report, name):
    """A learner's answer with one mistake fails, and the summary says what must hold (in words), what
    broke (with the numbers) and, for a property, the whole example, with no blank argument."""
    key = name[4:6]
    run = report[key]["mistakes"][name]
    assert run["rc"] == 1, f"lab {key} passed with the mistake {name}:\n{run['output'][-3000:]}"
    summary = _summary(run, key)
    holds, broke, example = MISTAKES[name]
    assert holds in summary and broke in summary, summary
    assert example is None or example in summary, summary
    assert not re.search(r"\w=,", summary) and "teardown" not in summary, summary


def test_lab_every_planted_mistake_is_checked():
    """Each file of tests/lab_mistakes/ has its expected message here, and each one ran."""
    assert {p.stem for key in labs.LABS for p in labs.mistakes(key)} == set(MISTAKES)


@pytest.mark.parametrize("key", sorted(labs.LABS))
def test_lab_reference_passes_through_the_same_switch(report, key):
    run = report[key]["reference"]
    assert run["rc"] == 0, f"lab {key} with the reference failed:\n{run['output'][-3000:]}"
    assert f"every invariant holds: lab {key} passes." in run["output"]
    assert "the reference in paged/" in run["output"]


def test_lab_command_runs_one_lab_as_a_learner_would():
    """``python -m tests.labs NN`` itself (what ``make lab`` runs), once: exit status 1 and the summary."""
    done = run_labs("06", "-x")
    assert done.returncode == 1 and "lab 06: " in done.stdout and "FAILED tests/step06" in done.stdout


def test_lab_targets_exist_and_lab_files_define_them():
    """Every target is a function of the reference, and every lab file defines its name."""
    for key, lab in labs.LABS.items():
        source = (ROOT / "labs" / f"step{key}.py").read_text()
        for module, path, name in lab.targets:
            owner, attr = labs._owner(module, path)
            assert callable(vars(owner)[attr]), (key, path)
            assert f"def {name}(" in source, (key, name)


def test_lab_uninstall_puts_the_reference_back():
    """After a lab's run its functions are the reference's again (several labs share one process)."""
    before = {(m, p): vars(labs._owner(m, p)[0])[labs._owner(m, p)[1]] for lab in labs.LABS.values()
              for m, p, _ in lab.targets}
    try:
        for key in labs.LABS:
            labs.install(key)
    finally:
        labs.uninstall()
    after = {(m, p): vars(labs._owner(m, p)[0])[labs._owner(m, p)[1]] for m, p in before}
    assert after == before


def test_lab_unknown_step_is_refused_with_the_list():
    done = run_labs("07")
    assert done.returncode == 2
    assert "no lab for step '07': the labs are 01, 02, 03, 04, 05, 06" in done.stderr
