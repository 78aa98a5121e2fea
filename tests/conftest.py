"""Shared pytest setup: the Hypothesis profiles and the per-step markers.

Profiles: ``ci`` (the default under ``make test``) has no deadline, because
timings on a 2-core machine are noisy, and a bounded number of examples so the
whole suite stays well inside CI's budget. ``dev`` runs more examples; choose it
with ``HYPOTHESIS_PROFILE=dev``.
"""

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)
settings.register_profile("dev", deadline=None, max_examples=300)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config, items):
    """Mark every test with its step (``tests/step03_attention/...`` -> ``step03``)."""
    for item in items:
        parts = item.nodeid.split("/")
        if len(parts) > 1 and parts[1].startswith("step") and parts[1][4:6].isdigit():
            item.add_marker(getattr(pytest.mark, parts[1][:6]))
