"""The ladder (docs/architecture.md): each step re-exports everything the step below exports, and
imports only what lies below it."""

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import paged

pytestmark = pytest.mark.layering


def _steps():
    names = sorted(
        m.name for m in pkgutil.iter_modules(paged.__path__) if m.name.startswith("step")
    )
    return [importlib.import_module(f"paged.{n}") for n in names]


def test_layering_steps_are_numbered_without_gaps():
    numbers = [int(m.__name__.split(".")[1][4:6]) for m in _steps()]
    assert numbers == list(range(1, len(numbers) + 1))


_PAIRS = list(zip(_steps(), _steps()[1:]))


@pytest.mark.parametrize(
    "lower, upper", _PAIRS, ids=[f"{a.__name__[6:12]}<{b.__name__[6:12]}" for a, b in _PAIRS]
)
def test_layering_each_step_all_contains_previous(lower, upper):
    missing = set(lower.__all__) - set(upper.__all__)
    assert not missing, f"{upper.__name__} drops {sorted(missing)} from {lower.__name__}"
    for name in lower.__all__:
        old, new = getattr(lower, name), getattr(upper, name)
        # the same object, or (like each step's LLM) a subclass that extends it
        assert new is old or (isinstance(old, type) and issubclass(new, old)), name


def test_layering_every_all_name_exists():
    for step in _steps():
        for name in step.__all__:
            assert hasattr(step, name), f"{step.__name__}.__all__ names missing {name}"


# -- import direction ------------------------------------------------------------------
PAGED = Path(paged.__file__).resolve().parent
BELOW_THE_STEPS = ("paged.models", "paged.kernels", "paged.sampling", "paged.errors", "paged._lazy",
                   "paged._openmp")  # what a step may import
# Below the steps, a ladder too: a package imports only packages on a floor under its own (kernels hold the
# contiguous oracle that the models' reference attention and the kernels' fallback both call).
FLOOR_BELOW_THE_STEPS = {"paged.errors": 0, "paged._lazy": 0, "paged._openmp": 0, "paged.kernels": 1,
                         "paged.sampling": 2, "paged.models": 2}
ABOVE_THE_STEPS = ("paged.bench", "paged.serve", "paged.demo")  # what no step may import


def _imports(path: Path, module: str) -> list[tuple[int, str]]:
    """``(line, imported module)`` of every import in the file, those inside functions included.

    ``from X import Y`` counts as ``X.Y`` (``Y`` may be a submodule); relative
    imports are resolved against ``module``'s package.
    """
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def _modules(folder: Path) -> list[tuple[Path, str]]:
    """Every ``.py`` file under ``folder`` with its dotted module name."""
    return [(p, ".".join(p.relative_to(PAGED.parent).with_suffix("").parts).removesuffix(".__init__"))
            for p in sorted(folder.rglob("*.py"))]


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _step_number(name: str) -> int | None:
    """N of ``paged.stepNN_*``, None for any other module."""
    parts = name.split(".")
    if len(parts) > 1 and parts[0] == "paged" and parts[1].startswith("step"):
        return int(parts[1][4:6])
    return None


def _floor_below_the_steps(name: str) -> int | None:
    """The floor of the package below the steps that holds ``name`` (``FLOOR_BELOW_THE_STEPS``), else None."""
    return next((floor for p, floor in FLOOR_BELOW_THE_STEPS.items() if _within(name, p)), None)


def upward_imports(folder: Path) -> list[str]:
    """The imports under ``folder`` (a step, ``paged/models`` or ``paged/kernels``) that point up the ladder.

    Step N may import steps < N, itself, and what lies below the steps (``paged.models``,
    ``paged.kernels``, ``paged.sampling``, ``paged.errors``); those import no step, and each of them only
    itself and the packages on a floor under its own (``FLOOR_BELOW_THE_STEPS``: ``paged.kernels`` imports no
    ``paged.models``). Nothing of them imports ``paged`` itself (it is the top of the ladder), ``paged.bench``,
    ``paged.serve`` or ``paged.demo``.
    """
    bad = []
    for path, module in _modules(folder):
        own = _step_number(module)
        own_floor = _floor_below_the_steps(module)
        for line, name in _imports(path, module):
            if not _within(name, "paged"):
                continue
            step = _step_number(name)
            if step is not None:
                ok = own is not None and step <= own
            else:
                ok = any(_within(name, p) for p in BELOW_THE_STEPS)
                floor = _floor_below_the_steps(name)
                if ok and own_floor is not None and name.split(".")[:2] != module.split(".")[:2]:
                    ok = floor < own_floor
            if not ok:
                bad.append(f"{path.relative_to(PAGED.parent)}:{line} imports {name}")
    return bad


LAYERS = (sorted(p for p in PAGED.iterdir() if p.name.startswith("step"))
          + [PAGED / "models", PAGED / "kernels", PAGED / "sampling"])


@pytest.mark.parametrize("folder", LAYERS, ids=[p.name for p in LAYERS])
def test_layering_imports_point_down_the_ladder(folder):
    """Read from the source (the AST, so lazy imports inside functions count): step N imports only steps
    below it and what lies below the steps (``paged.models``, ``paged.kernels``, ``paged.sampling``,
    ``paged.errors``); those import no step; none imports
    ``paged.bench``, ``paged.serve``, ``paged.demo`` or the top-level ``paged``."""
    assert upward_imports(folder) == []


def test_layering_check_sees_an_upward_import_inside_a_function(tmp_path):
    """The checker itself: a lazy ``paged.bench`` import in a step, a step import in ``paged.models``
    or ``paged.sampling``, and a lazy ``paged.models`` import in ``paged.kernels`` are each reported
    (``paged.errors`` from ``paged.sampling`` and ``paged.kernels`` from ``paged.models`` are not)."""
    step = tmp_path / "paged" / "step03_attention"
    models = tmp_path / "paged" / "models"
    step.mkdir(parents=True)
    models.mkdir()
    (step / "tool.py").write_text("import torch\n\ndef f():\n    from paged.bench import sharing\n")
    (models / "x.py").write_text("from ..step02_block_table import KVCache\nfrom . import config\n"
                                 "from paged.kernels.contiguous import causal_attention\n")
    kernels = tmp_path / "paged" / "kernels"
    kernels.mkdir()
    (kernels / "k.py").write_text("from paged.kernels import cpu\n\ndef f():\n    from paged.models.contiguous import x\n")
    global PAGED
    saved, PAGED = PAGED, tmp_path / "paged"
    try:
        assert upward_imports(step) == ["paged/step03_attention/tool.py:4 imports paged.bench.sharing"]
        assert upward_imports(models) == ["paged/models/x.py:1 imports paged.step02_block_table.KVCache"]
        assert upward_imports(kernels) == ["paged/kernels/k.py:4 imports paged.models.contiguous.x"]
        sampling = tmp_path / "paged" / "sampling"
        sampling.mkdir()
        (sampling / "y.py").write_text("from paged.errors import RequestError\nfrom paged.step03_attention.plan import StepPlan\n")
        assert upward_imports(sampling) == ["paged/sampling/y.py:2 imports paged.step03_attention.plan.StepPlan"]
    finally:
        PAGED = saved


# -- no import circles ----------------------------------------------------------------------------
# Circles still owed, each a frozenset of modules (none): the test below fails on any circle.
OWED_CIRCLES: list[frozenset[str]] = []


def import_graph(folder: Path) -> dict[str, set[str]]:
    """Module -> the modules of ``folder`` it imports (read from the AST: lazy imports count).

    ``from X import Y`` points at ``X.Y`` when that is a module of the tree, else at ``X``; importing a
    module does not count as importing its parent package (a package's ``__init__`` is its face).
    """
    modules = dict((module, path) for path, module in _modules(folder))
    graph = {}
    for module, path in modules.items():
        targets = set()
        for _, name in _imports(path, module):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def import_circles(folder: Path) -> list[frozenset[str]]:
    """The sets of modules under ``folder`` that import each other in a loop (strongly connected
    components of more than one module, Tarjan's algorithm), sorted."""
    graph = import_graph(folder)
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found, key=sorted)


def test_layering_paged_has_no_import_circle():
    """From the AST (lazy imports count): no two modules of ``paged/`` import each other, directly or
    around a loop, but the circles still owed (``OWED_CIRCLES``)."""
    assert import_circles(PAGED) == OWED_CIRCLES


def test_layering_circle_check_sees_a_circle_through_a_lazy_import(tmp_path):
    """The checker itself: a loop of three modules closed by an import inside a function is one circle;
    a module importing its own package's face, and a chain without a loop, are none."""
    models = tmp_path / "paged" / "models"
    models.mkdir(parents=True)
    (models / "__init__.py").write_text("from paged.models.a import f\n")
    (models / "a.py").write_text("from paged.models import b\n\ndef f():\n    pass\n")
    (models / "b.py").write_text("from paged.models.c import g\n")
    (models / "c.py").write_text("def g():\n    from paged.models.a import f\n")
    (models / "d.py").write_text("import paged.models\nfrom paged.models.c import g\n")
    global PAGED
    saved, PAGED = PAGED, tmp_path / "paged"
    try:
        assert import_circles(PAGED) == [frozenset({"paged.models.a", "paged.models.b", "paged.models.c"})]
        (models / "c.py").write_text("def g():\n    pass\n")
        assert import_circles(PAGED) == []
    finally:
        PAGED = saved


# -- one scheduler loop: a step swaps components, it overrides nothing ----------------------------
def _scheduler_subclasses() -> list[str]:
    """Every class under ``paged/`` that subclasses the scheduler (read from the AST: each class whose
    bases name ``Scheduler``)."""
    found = []
    for path, module in _modules(PAGED):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and any(
                    (isinstance(b, ast.Name) and b.id == "Scheduler") or (isinstance(b, ast.Attribute) and
                                                                         b.attr == "Scheduler")
                    for b in node.bases):
                found.append(f"{module}.{node.name}")
    return found


def test_layering_the_scheduler_loop_has_no_override_point():
    """The scheduler is one class, written once in step03: no class under ``paged/`` subclasses it (0
    override points), and each step's scheduler is that class holding the step's components — the
    table of docs/architecture.md, as code. Step04 swaps the KV manager and the decoding component,
    step05 the KV manager (again), the eviction and the chunking (and the order, when asked: ``FairShare`` or ``PriorityFirst``);
    the Orca baselines the admission."""
    from paged.bench.reservation import OrcaReservation, ReservingEngine
    from paged.step03_attention import EndRequest, FirstComeFirstServed, KVManager, OneSequence, Reservation, WholePrompt
    from paged.step03_attention.scheduler import Scheduler, build_scheduler as step03
    from paged.step04_sharing import SequenceGroups, SharingKVManager
    from paged.step04_sharing.scheduler import build_scheduler as step04
    from paged.step05_preemption import ChunkedPrefill, FairShare, Preemption, PriorityFirst, SwappingKVManager
    from paged.step05_preemption.scheduler import build_scheduler as step05
    from paged.step03_attention.request import StopChecker

    assert _scheduler_subclasses() == []
    common = dict(max_num_seqs=4, max_num_batched_tokens=16, stops=StopChecker([2], 64))
    parts = lambda s: (type(s.kv), type(s.chunking), type(s.eviction), type(s.admission), type(s.decoding),  # noqa: E731
                       type(s.order))
    built = {name: build(8, 4, **common) for name, build in (("03", step03), ("04", step04), ("05", step05))}
    built["05 fair"] = step05(8, 4, order=FairShare(), **common)
    built["05 priority"] = step05(8, 4, order=PriorityFirst(), **common)
    assert all(type(s) is Scheduler for s in built.values())
    fcfs = FirstComeFirstServed
    assert parts(built["03"]) == (KVManager, WholePrompt, EndRequest, Reservation, OneSequence, fcfs)
    assert parts(built["04"]) == (SharingKVManager, WholePrompt, EndRequest, Reservation, SequenceGroups, fcfs)
    assert parts(built["05"]) == (SwappingKVManager, ChunkedPrefill, Preemption, Reservation, SequenceGroups, fcfs)
    for name, order in (("05 fair", FairShare), ("05 priority", PriorityFirst)):
        assert parts(built[name]) == (SwappingKVManager, ChunkedPrefill, Preemption, Reservation, SequenceGroups, order)
    # the Orca baselines change admission by swapping that component, not by a subclass of the loop
    assert issubclass(OrcaReservation, Reservation) and not hasattr(ReservingEngine, "schedule")


def test_layering_the_override_check_sees_a_scheduler_subclass(tmp_path):
    """The checker itself: a class deriving from ``Scheduler`` (by name or attribute) is reported."""
    step = tmp_path / "paged" / "step05_preemption"
    step.mkdir(parents=True)
    (step / "x.py").write_text("from paged.step03_attention import scheduler\n"
                               "class Mine(scheduler.Scheduler):\n    pass\n")
    global PAGED
    saved, PAGED = PAGED, tmp_path / "paged"
    try:
        assert _scheduler_subclasses() == ["paged.step05_preemption.x.Mine"]
    finally:
        PAGED = saved
