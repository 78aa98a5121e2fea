"""OpenMP's wait policy (paged/_openmp.py): chosen before torch loads libgomp, a user's choice kept.

libgomp prints what it read from the environment when ``OMP_DISPLAY_ENV=verbose``; ``GOMP_SPINCOUNT`` is
the spin count its threads use before sleeping (0 under ``OMP_WAIT_POLICY=passive``, 300 000 by default).
"""

import os
import subprocess
import sys

from paged import _openmp


def _libgomp_settings(code: str, **env: str) -> str:
    """What libgomp read from the environment when ``code`` loaded it (its OMP_DISPLAY_ENV report)."""
    clean = {k: v for k, v in os.environ.items() if k not in _openmp.USER_KNOBS}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**clean, "OMP_DISPLAY_ENV": "verbose", "OMP_NUM_THREADS": "1", **env})
    return done.stderr


def test_importing_paged_first_makes_openmp_threads_sleep_at_once():
    assert "GOMP_SPINCOUNT = '0'" in _libgomp_settings("import paged, torch")


def test_a_policy_the_user_set_is_kept():
    report = _libgomp_settings("import paged, torch", OMP_WAIT_POLICY="active")
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in report and "GOMP_SPINCOUNT = '0'" not in report
    assert "GOMP_SPINCOUNT = '1000'" in _libgomp_settings("import paged, torch", GOMP_SPINCOUNT="1000")


def test_torch_imported_first_keeps_libgomp_default_and_a_busy_machine_is_told_how_to_choose():
    environ = {}
    note = _openmp.choose_wait_policy(environ, torch_loaded=True, load=3.2, cores=2)
    assert environ == {}, "too late to choose: libgomp read its environment when torch loaded it"
    assert "load average 3.2 on 2 cores" in note and "OMP_WAIT_POLICY=passive" in note
    assert _openmp.choose_wait_policy(environ, torch_loaded=True, load=0.1, cores=2) is None  # idle: nothing to say
    assert _openmp.choose_wait_policy({"OMP_WAIT_POLICY": "active"}, torch_loaded=True, load=3.2, cores=2) is None


def test_the_choice_is_made_before_torch_loads_and_only_then():
    environ = {}
    assert _openmp.choose_wait_policy(environ, torch_loaded=False, load=0.0, cores=2) is None
    assert environ == {"OMP_WAIT_POLICY": "passive"}
