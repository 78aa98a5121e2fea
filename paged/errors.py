"""``RequestError``: a request the engine refuses, with the field at fault and its bound.

Every check of a request (``SamplingParams`` at construction, ``Engine.add_request``
before queueing) raises this one type. It is a ``ValueError``, so plain Python
code can catch it as one; the server reads ``param`` from it to fill the OpenAI
error's ``param`` instead of parsing the message text.
"""

from __future__ import annotations


class RequestError(ValueError):
    """A request that can never run as given; nothing was queued or changed.

    Args:
        message: what was wrong and what the bound is, for a person.
        param: the offending field as the offline API names it
            (``"temperature"``, ``"prompt"``, ``"n"``); None when no single
            field is at fault.
        bound: the limit the value broke, when there is one (``(0, 2)``, ``20``).
    """

    def __init__(self, message: str, param: str | None = None, bound: object = None) -> None:
        super().__init__(message)
        self.param = param
        self.bound = bound

    def for_prompt(self, index: int) -> RequestError:
        """The same refusal, its message led by which prompt of a batch it concerns."""
        return RequestError(f"prompt {index}: {self}", param=self.param, bound=self.bound)
