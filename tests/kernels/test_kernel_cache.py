"""The CPU kernel's build folder: keyed by the sources, and never blocked by a dead build's lock."""

import os
import time

import pytest

from paged.kernels import cpu
from paged.kernels.build_cache import place_key, source_key


def test_the_build_folder_changes_with_the_sources(tmp_path):
    (tmp_path / "a.cpp").write_text("int f() { return 1; }")
    before = source_key(tmp_path)
    assert source_key(tmp_path) == before  # the same sources, the same folder
    (tmp_path / "a.cpp").write_text("int f() { return 2; }")
    assert source_key(tmp_path) != before


def test_a_stale_lock_is_removed_and_a_fresh_one_kept(tmp_path):
    lock = tmp_path / "lock"
    lock.touch()
    cpu._clear_stale_lock(tmp_path)
    assert lock.exists(), "a build in progress holds this lock"
    old = time.time() - cpu.STALE_LOCK_S - 60
    os.utime(lock, (old, old))
    with pytest.warns(RuntimeWarning, match="stale kernel build lock"):
        cpu._clear_stale_lock(tmp_path)
    assert not lock.exists()


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
