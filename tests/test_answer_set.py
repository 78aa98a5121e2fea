"""The answer set (``tools/answer_set.py``): its grading, and the default model's score held at a floor.

``make test`` runs the 30 questions on the model ``LLM()`` and ``make serve`` use by default, at
their default settings (greedy, through the chat template), and fails if fewer than ``FLOOR``
answers pass: a change that breaks the default path (the loader, a kernel, the template, the
tokenizer) shows as lost answers. The floor is the score measured when the default was chosen
(docs/models.md), less a margin of two answers for a change that moves a near tie.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from paged.models.default import default_model

_SPEC = importlib.util.spec_from_file_location("answer_set", Path(__file__).parents[1] / "tools" / "answer_set.py")
answer_set = sys.modules["answer_set"] = importlib.util.module_from_spec(_SPEC)  # dataclasses look it up there
_SPEC.loader.exec_module(answer_set)

MEASURED = 15  # SmolLM2-135M-Instruct, bfloat16, dense: its score when it was chosen (docs/models.md)
FLOOR = MEASURED - 2


def test_answer_set_grades_by_every_group():
    """Exact: a right answer passes, a wrong one fails, each group must match, case where it counts."""
    by_prompt = {q.prompt: q for q in answer_set.QUESTIONS}
    assert len(answer_set.QUESTIONS) == 30
    assert by_prompt["What is the capital of France?"].passes("The capital of France is Paris.")
    assert not by_prompt["What is the capital of France?"].passes("It is Lyon, not Parisian.")
    assert by_prompt["What is 12 times 7?"].passes("12 x 7 = 84")
    assert not by_prompt["What is 12 times 7?"].passes("It is 842.")
    code = by_prompt["Write a Python function that reverses a list."]
    assert code.passes("def rev(xs):\n    return xs[::-1]") and not code.passes("xs[::-1]")
    assert not by_prompt["Write the word banana in capital letters."].passes("banana")


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(default_model()[1] == "paged-demo", reason="no chat model is fetched (make install fetches "
                    "them); the bundled demo model does not chat")
def test_answer_set_default_model_keeps_its_score():
    """Floor: the default model at the default settings answers at least ``FLOOR`` of the 30."""
    result = answer_set.run(default_model()[0])
    for a in result["answers"]:
        print(f"[{'pass' if a['pass'] else 'FAIL'}] {a['prompt']} -> {a['answer'][:120]!r}")
    assert result["score"] >= FLOOR, f"{result['score']}/30 {result['by_kind']}"
