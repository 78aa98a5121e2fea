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


def test_threads_spin_reads_the_environment_as_libgomp_does():
    """Exact: GOMP_SPINCOUNT wins when set (a count, with libgomp's suffixes, at least the spins that
    bridge a decode step; or infinite), else every policy but passive spins (libgomp's default does)."""
    cases = [({}, True), ({"OMP_WAIT_POLICY": "passive"}, False), ({"OMP_WAIT_POLICY": "ACTIVE"}, True),
             ({"GOMP_SPINCOUNT": "10000"}, False), ({"GOMP_SPINCOUNT": "30k"}, True),
             ({"GOMP_SPINCOUNT": "infinite", "OMP_WAIT_POLICY": "passive"}, True),
             ({"GOMP_SPINCOUNT": "1M", "OMP_WAIT_POLICY": "passive"}, True),
             ({"GOMP_SPINCOUNT": "0", "OMP_WAIT_POLICY": "active"}, False),
             ({"GOMP_SPINCOUNT": "lots", "OMP_WAIT_POLICY": "passive"}, False)]
    assert [_openmp.threads_spin(environ) for environ, _ in cases] == [spins for _, spins in cases]


def test_a_spinning_policy_gives_the_linears_their_second_thread_from_smaller_calls():
    """Exact: ``layers.SECOND_THREAD_BYTES`` is 2 MB where idle threads sleep (paged's default) and
    256 KB where they spin (the user's ``OMP_WAIT_POLICY=active``); the quantized linear's rule is its
    kernel's own (None) and 256 K weights x rows; each read in a fresh process."""
    code = ("import paged.models.layers as layers, paged.models.quantized as quantized; "
            "print(layers.SECOND_THREAD_BYTES, quantized.SECOND_THREAD_WEIGHTS)")
    clean = {k: v for k, v in os.environ.items() if k not in _openmp.USER_KNOBS}
    seen = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**clean, **policy}).stdout.split()[-2:] for policy in ({}, {"OMP_WAIT_POLICY": "active"})]
    assert seen == [[str(2 << 20), "None"], [str(256 << 10), str(256 << 10)]]
