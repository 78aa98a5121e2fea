"""Shared pytest setup: the Hypothesis profiles and the per-step markers.

Profiles: ``ci`` (the default under ``make test``) has no deadline, because
timings on a 2-core machine are noisy, and a bounded number of examples so the
whole suite stays well inside CI's budget; it is derandomized, so CI replays
the same examples on every run and a red run reproduces. ``dev`` is randomized
and runs more examples: ``make test-deep`` runs the property tests with it
(new examples every time; a failure prints the seed to reproduce it with
``--hypothesis-seed``). ``mutation`` (``make mutation``) is ``ci`` with few
examples, as the tests run once per mutant. The header of every run names the profile.
"""

import os

import pytest
from hypothesis import HealthCheck, is_hypothesis_test, settings

settings.register_profile(
    "ci",
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)
settings.register_profile("dev", deadline=None, max_examples=300)
# `make mutation` runs the model-free scheduler tests once per mutant: few examples, the same every run
settings.register_profile("mutation", deadline=None, max_examples=8, derandomize=True,
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


def pytest_collection_modifyitems(config, items):
    """Mark every test with its step (``tests/step03_attention/...`` -> ``step03``), and every
    Hypothesis test with ``property``."""
    for item in items:
        if _is_property_test(item):
            item.add_marker(pytest.mark.property)
        parts = item.nodeid.split("/")
        if len(parts) > 1 and parts[1].startswith("step") and parts[1][4:6].isdigit():
            item.add_marker(getattr(pytest.mark, parts[1][:6]))
