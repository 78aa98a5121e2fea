"""The labs' switch is sound: for every lab, the stubs fail and the reference passes.

``python -m tests.labs NN`` (``make lab STEP=NN``) runs step NN's tests with the
functions of ``labs/stepNN.py`` in place of the reference ones; ``--reference`` puts
the reference's own functions through the same switch. ``python -m tests.labs --check``
does both for every lab in one subprocess (torch, Hypothesis and the test modules are
imported once, not once per run) and reports each run's exit status and summary; the
cases below read that report:

* the committed stubs must fail, and the summary must name the test and the invariant
  or rule that broke (a lab that passes with stubs teaches nothing);
* the reference must pass (otherwise the switch, not the learner, is wrong).

A learner who solves a lab makes the first case fail for it: that is the lab passing
(``git checkout labs/stepNN.py`` brings the stub back). The stub runs stop at the first
failing test (``-x``), and the subprocess uses the ``labcheck`` profile (8 examples per
property: the ordinary suite runs the same tests in full on the reference).
"""

import json
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


@pytest.mark.parametrize("key", sorted(labs.LABS))
def test_lab_stubs_fail_naming_the_invariant(report, key):
    run = report[key]["labs"]
    assert run["rc"] == 1, f"lab {key}'s stubs did not fail:\n{run['output'][-3000:]}"
    summary = run["output"][run["output"].index(f"lab {key}: "):]
    assert "FAILED tests/step" in summary and "invariant or rule that broke: " in summary, summary
    assert f"labs/step{key}.py" in summary, summary


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
