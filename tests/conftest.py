"""Shared pytest setup: the Hypothesis profiles and the per-step markers.

Profiles: ``ci`` (the default under ``make test``) has no deadline, because
timings on a 2-core machine are noisy, and a bounded number of examples so the
whole suite stays well inside CI's budget; it is derandomized, so CI replays
the same examples on every run and a red run reproduces. ``dev`` is randomized
and runs more examples: ``make test-deep`` runs the property tests with it
(new examples every time; a failure prints the seed to reproduce it with
``--hypothesis-seed``). ``mutation`` (``make mutation``) is ``ci`` with few
examples and no shrinking, as the tests run once per mutant. The header of every run names the profile.
"""

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, is_hypothesis_test, settings

# OpenMP threads that sleep between parallel regions instead of spinning (paged/_openmp.py): on a machine
# other processes keep busy, spinning threads made the suite several times slower. Set here, before any
# test module imports torch (libgomp reads it once, when torch loads it); servers the tests start inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

# GGUF files loaded by the tests keep their converted weights (paged/models/gguf_cache.py) in a
# folder of this run, removed at its end: the suite neither reads nor leaves entries in the user's cache.
if "PAGED_GGUF_CACHE" not in os.environ:
    os.environ["PAGED_GGUF_CACHE"] = tempfile.mkdtemp(prefix="paged-gguf-cache-")
    atexit.register(shutil.rmtree, os.environ["PAGED_GGUF_CACHE"], ignore_errors=True)


# transformers parses a GGUF file's header with ``gguf.GGUFReader`` on every load from it (twice for a
# model, once for a tokenizer): 13 s for Gemma 3 270M's file on 2 cores, and the tests that hold paged to
# transformers load the same two shipped files several times. In this process one parse per file is
# shared: the reader is read-only (its tensors map the file), and the key holds the file's size and time
# of change, so a file rewritten under the same name is parsed again. What each parse sees is unchanged.
# (Where gguf is not installed, as on the GPU machine, the tests that need it skip, and nothing is shared.)
def _share_gguf_parses():
    try:
        import gguf
    except ImportError:
        return

    parse, parsed = gguf.GGUFReader, {}

    def shared_reader(path, mode="r"):
        if mode != "r":
            return parse(path, mode)
        stat = os.stat(path)
        key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
        if key not in parsed:
            parsed[key] = parse(path, mode)
        return parsed[key]

    gguf.GGUFReader = shared_reader


_share_gguf_parses()

settings.register_profile(
    "ci",
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)
settings.register_profile("dev", deadline=None, max_examples=300)
# tests/test_labs.py: a lab's tests through the lab switch, fewer examples (the suite runs them in full)
settings.register_profile("labcheck", settings.get_profile("ci"), max_examples=8)
# `make mutation` runs the model-free scheduler tests once per mutant: few examples, the same every run,
# and no shrinking — a mutant is caught by the first failing example; nobody reads a shrunk one, and
# shrinking a mutant that stalls the scheduler reruns thousands of iterations per attempt
settings.register_profile("mutation", deadline=None, max_examples=8, derandomize=True, database=None,
                          phases=(Phase.explicit, Phase.reuse, Phase.generate),
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_report_header(config):
    profile = settings.get_current_profile_name()
    return f"hypothesis profile: {profile} ({settings().max_examples} examples, derandomize={settings().derandomize})"


def _is_property_test(item) -> bool:
    """A ``@given`` test, or the ``runTest`` of a Hypothesis state machine's ``TestCase``."""
    if is_hypothesis_test(getattr(item, "obj", None)):
        return True
    machine = getattr(getattr(item, "cls", None), "state_machine_factory", None)
    return machine is not None


# the folders that mirror a package below the ladder, and the step whose page teaches them
STEP_OF_FOLDER = {"models": "step02", "kernels": "step03"}


def pytest_collection_modifyitems(config, items):
    """Mark every test with its step (``tests/step03_attention/...`` -> ``step03``; the model
    loaders' tests with step02's marker, the kernels' with step03's, the steps that teach them),
    and every Hypothesis test with ``property``."""
    for item in items:
        if _is_property_test(item):
            item.add_marker(pytest.mark.property)
        parts = item.nodeid.split("/")
        folder = parts[1] if len(parts) > 1 else ""
        step = STEP_OF_FOLDER.get(folder, folder[:6] if folder.startswith("step") and folder[4:6].isdigit() else None)
        if step:
            item.add_marker(getattr(pytest.mark, step))
    if getattr(config, "_lab", None):  # make lab STEP=NN: only the lab's tests
        _lab_deselect(config, items)


# -- labs: `make lab STEP=NN` (tests/labs.py) ---------------------------------------------------
def pytest_addoption(parser):
    group = parser.getgroup("labs", "the learner's labs (tests/labs.py, labs/stepNN.py)")
    group.addoption("--lab", metavar="NN", default=None,
                    help="run step NN's lab: its tests, with labs/stepNN.py's functions in place of the reference's")
    group.addoption("--lab-source", metavar="labs|reference|FILE", default="labs",
                    help="where the lab's functions come from (default labs/stepNN.py)")


def pytest_configure(config):
    if config.getoption("--lab", default=None):
        from tests import labs

        try:
            config._lab = labs.install(config.getoption("--lab"), config.getoption("--lab-source"))
        except ValueError as err:
            raise pytest.UsageError(str(err)) from None
        config._lab_failures = []
        origin = Path(config._lab[2])
        config._lab_file = (labs.ROOT / origin).resolve() if origin.suffix == ".py" else None
        config.option.durations = None  # a learner reads the summary, not which test was slow
        # one failure per test, shrunk, rather than a group of every distinct bug found; no "explain"
        # phase: it replaces arguments that do not matter by "# or any other generated value", and a
        # learner needs the whole example to replay it
        settings.register_profile("lab", settings(settings(), report_multiple_bugs=False,
                                                  phases=[p for p in Phase if p is not Phase.explain]))
        settings.load_profile("lab")


def pytest_unconfigure(config):
    if getattr(config, "_lab", None):  # several labs in one process (tests.labs --check)
        from tests import labs

        labs.uninstall()


def _lab_deselect(config, items):
    from tests import labs

    _, lab, _ = config._lab
    keep = [i for i in items if labs.selected(i.nodeid, lab)]
    config.hook.pytest_deselected(items=[i for i in items if i not in keep])
    items[:] = keep


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is None or not report.failed or not getattr(item.config, "_lab", None):
        return
    from tests import lab_report

    item.config._lab_failures.append(lab_report.describe(item, call))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not getattr(config, "_lab", None):
        return
    from tests import lab_report

    key, lab, origin = config._lab
    terminalreporter.section(f"lab {key}: {lab.title}")
    lab_report.write_summary(terminalreporter.write_line, key, origin,
                             [name for _, _, name in lab.targets], config._lab_failures, exitstatus == 0)
