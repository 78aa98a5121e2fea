"""The ladder (STYLE §2): each step re-exports everything the step below exports."""

import importlib
import pkgutil

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
