"""A missing optional dependency is named with its extra and the command that installs it (paged/extras.py)."""

import subprocess
import sys
from pathlib import Path

import pytest

from paged import extras

ROOT = Path(__file__).resolve().parents[1]
# `python -m paged.serve --help` in a Python where fastapi cannot be imported (as after `pip install paged`)
SERVE_WITHOUT_FASTAPI = """
import runpy, sys
sys.modules["fastapi"] = None  # import fastapi now raises ModuleNotFoundError, as when it is not installed
sys.argv = ["paged.serve", "--help"]
runpy.run_module("paged.serve", run_name="__main__", alter_sys=True)
"""


def test_serve_without_its_extra_names_the_extra_and_the_pip_command():
    done = subprocess.run([sys.executable, "-c", SERVE_WITHOUT_FASTAPI], capture_output=True, text=True)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: python -m paged.serve needs the optional dependencies of "
                           "paged[serve], and fastapi is not installed: pip install 'paged[serve]'"), last


def test_the_serve_extra_is_read_from_the_installed_metadata_as_pyproject_lists_it():
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11's standard library reads pyproject.toml")
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["serve"]
    assert extras.extra_requirements("serve") == [extras._NAME.match(r)[1] for r in listed]


def test_a_missing_module_outside_the_extra_is_left_as_it_was():
    err = ModuleNotFoundError("No module named 'nonexistent_xyz'", name="nonexistent_xyz")
    assert extras.missing_extra(err, "serve", "python -m paged.serve") is None


def test_an_extra_package_that_is_not_installed_is_named(monkeypatch):
    monkeypatch.setattr(extras, "extra_requirements", lambda extra: ["fastapi", "not-installed-pkg"])
    err = ModuleNotFoundError("No module named 'not_installed_pkg_module'", name="not_installed_pkg_module")
    new = extras.missing_extra(err, "serve", "python -m paged.serve")
    assert "not-installed-pkg is not installed: pip install 'paged[serve]'" in str(new)
    assert new.name == "not_installed_pkg_module"
