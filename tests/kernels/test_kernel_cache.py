"""The CPU kernel's build folder: keyed by the sources, and never blocked by a dead build's lock."""

import contextlib
import os
import queue
import shutil
import subprocess
import sys
import threading
import time

import pytest

from paged.kernels import cpu
from paged.kernels.build_cache import build_lock, place_key, source_key


def test_the_build_folder_changes_with_the_sources(tmp_path):
    (tmp_path / "a.cpp").write_text("int f() { return 1; }")
    before = source_key(tmp_path)
    assert source_key(tmp_path) == before  # the same sources, the same folder
    (tmp_path / "a.cpp").write_text("int f() { return 2; }")
    assert source_key(tmp_path) != before


def test_a_lock_left_by_a_dead_builder_is_removed_by_the_next_holder(tmp_path):
    """cpp_extension's ``lock`` file names no owner; once ``build_lock`` is held, one found there was left
    by a builder that died (every builder holds ``build_lock`` first), so it goes."""
    (tmp_path / "lock").touch()
    with build_lock(tmp_path, "x.so"):
        assert not (tmp_path / "lock").exists()
    assert (tmp_path / "paged.lock").read_text() == str(os.getpid())  # the holder, for a waiter's message


HOLDER = """
import sys, time
from pathlib import Path
from torch.utils.file_baton import FileBaton
from paged.kernels.build_cache import build_lock
folder = Path(sys.argv[1])
with build_lock(folder, "paged_cpu.so"):
    assert FileBaton(str(folder / "lock")).try_acquire()  # what cpp_extension.load does first
    print("building", flush=True)
    time.sleep(600)
"""
WAITER = "from paged.kernels import cpu; cpu.load(strict=True); print('loaded', flush=True)"
SAID_WAITING_S = 90  # a busy 2-core box takes seconds to import torch; the waiter says it waits long before this
LOADED_S = 120  # after the builder dies: a no-op ninja run and the import of the built library


def _lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put(line)


def test_a_waiting_load_goes_on_when_the_builder_is_killed(tmp_path, monkeypatch):
    """A builder killed mid-build (SIGKILL: no ``finally`` runs) leaves cpp_extension's lock file; a process
    already waiting on it says whose build it waits for, then loads the kernels once the builder is gone
    (before, it waited forever). The folder is a copy of the built one, so the load is a no-op build."""
    built = cpu._build_dir(cpu._source_dir())
    cpu.load(strict=True)
    monkeypatch.setenv("PAGED_EXTENSIONS_DIR", str(tmp_path))
    folder = cpu._build_dir(cpu._source_dir())
    for path in built.iterdir():
        if path.is_file() and path.name not in ("lock", "paged.lock"):
            shutil.copy2(path, folder / path.name)  # mtimes kept: ninja finds every object up to date
    env = dict(os.environ, OMP_NUM_THREADS="1")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline() == "building\n"
        assert (folder / "lock").exists()
        waiter = subprocess.Popen([sys.executable, "-c", WAITER], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env)
        said = queue.Queue()
        threading.Thread(target=_lines, args=(waiter.stderr, said), daemon=True).start()
        deadline, waiting = time.monotonic() + SAID_WAITING_S, ""
        while "waiting for process" not in waiting and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                waiting = said.get(timeout=1)
        assert waiter.poll() is None, "the waiter did not wait for the live builder"
        holder.kill()
        holder.wait()
        try:
            out, _ = waiter.communicate(timeout=LOADED_S)
        except subprocess.TimeoutExpired:
            waiter.kill()
            pytest.fail(f"the waiter still waits {LOADED_S} s after the builder died")
        assert waiter.returncode == 0 and out == "loaded\n"
        assert f"waiting for process {holder.pid}, which is building the C++ kernels" in waiting
    finally:
        holder.kill()


def test_two_checkouts_of_the_same_sources_build_in_two_folders(tmp_path):
    """Two copies of one source tree get two folders: each one's build.ninja names its own paths, and a
    folder shared between them would be rebuilt whenever the other copy loaded last."""
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.cpp").write_text("int f() { return 1; }")
    one, two = tmp_path / "one", tmp_path / "two"
    assert source_key(one) == source_key(two)  # the same sources...
    assert place_key(one) != place_key(two)  # ...in two places
    assert place_key(one) == place_key(tmp_path / "one" / ".." / "one")  # the same place, however spelled
    assert f"at{place_key(cpu._source_dir())}" in cpu._build_dir(cpu._source_dir()).name
