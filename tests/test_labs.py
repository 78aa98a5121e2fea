"""The labs' switch is sound: for every lab, the stubs fail and the reference passes.

``python -m tests.labs NN`` (``make lab STEP=NN``) runs step NN's tests with the
functions of ``labs/stepNN.py`` in place of the reference ones; ``--reference`` puts
the reference's own functions through the same switch. Each case runs that command in
a subprocess, as a learner would, and reads its exit status and its summary:

* the committed stubs must fail, and the summary must name the test and the invariant
  or rule that broke (a lab that passes with stubs teaches nothing);
* the reference must pass (otherwise the switch, not the learner, is wrong).

A learner who solves a lab makes the first case fail for it: that is the lab passing
(``git checkout labs/stepNN.py`` brings the stub back). The stub runs stop at the first
failing test (``-x``), and every run uses the ``labcheck`` profile (8 examples per
property: the ordinary suite runs the same tests in full on the reference), so the
cases stay cheap.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import labs

ROOT = Path(__file__).resolve().parent.parent


def run_lab(key: str, *args: str) -> subprocess.CompletedProcess:
    # the suite runs these tests in full on the reference; through the switch, fewer examples do
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HYPOTHESIS_PROFILE": "labcheck"}
    return subprocess.run([sys.executable, "-m", "tests.labs", key, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize("key", sorted(labs.LABS))
def test_lab_stubs_fail_naming_the_invariant(key):
    done = run_lab(key, "-x")
    assert done.returncode == 1, f"lab {key}'s stubs did not fail:\n{done.stdout[-3000:]}{done.stderr[-2000:]}"
    summary = done.stdout[done.stdout.index(f"lab {key}: "):]
    assert "FAILED tests/step" in summary and "invariant or rule that broke: " in summary, summary
    assert f"labs/step{key}.py" in summary, summary


@pytest.mark.parametrize("key", sorted(labs.LABS))
def test_lab_reference_passes_through_the_same_switch(key):
    done = run_lab(key, "--reference")
    assert done.returncode == 0, f"lab {key} with the reference failed:\n{done.stdout[-3000:]}{done.stderr[-2000:]}"
    assert f"every invariant holds: lab {key} passes." in done.stdout
    assert "the reference in paged/" in done.stdout


def test_lab_targets_exist_and_lab_files_define_them():
    """Every target is a function of the reference, and every lab file defines its name."""
    for key, lab in labs.LABS.items():
        source = (ROOT / "labs" / f"step{key}.py").read_text()
        for module, path, name in lab.targets:
            owner, attr = labs._owner(module, path)
            assert callable(vars(owner)[attr]), (key, path)
            assert f"def {name}(" in source, (key, name)


def test_lab_unknown_step_is_refused_with_the_list():
    done = run_lab("07")
    assert done.returncode == 2
    assert "no lab for step '07': the labs are 01, 02, 03, 06" in done.stderr
