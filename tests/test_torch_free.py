"""The scheduler's side runs without torch: its model-free tests load no tensor library and no model.

docs/architecture.md: the scheduler decides, the runner obeys; the deciding half
(queues, block pool, budgets, the stand-in runner) holds no tensor. Each check
runs in a fresh interpreter (this process has torch loaded already) and is exact:
``torch`` either is in ``sys.modules`` after the imports or is not.
"""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.layering

ROOT = Path(__file__).resolve().parent.parent
MODEL_FREE = (
    "tests.step03_attention.test_scheduler_rules",
    "tests.step04_sharing.test_scheduler_rules",
    "tests.step05_preemption.test_scheduler_rules",
    "tests.step05_preemption.test_scheduler_model_free",
    "tests.scheduler_harness",
    "paged.step03_attention.stand_in",
)


def loaded_after_import(modules) -> list[str]:
    """The modules in ``sys.modules`` of a fresh interpreter after importing ``modules``."""
    code = "import sys\n" + "".join(f"import {m}\n" for m in modules) + "print('\\n'.join(sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    return done.stdout.split()


@pytest.mark.parametrize("module", MODEL_FREE)
def test_torch_free_model_free_scheduler_tests_import_no_torch_and_no_model(module):
    loaded = loaded_after_import([module])
    assert "torch" not in loaded
    assert not [m for m in loaded if m.startswith(("paged.models", "paged.kernels"))]


def test_torch_free_check_sees_torch_when_a_module_imports_it():
    """The check itself: the engine (which runs a model) does load torch."""
    assert "torch" in loaded_after_import(["paged.step03_attention.engine"])
