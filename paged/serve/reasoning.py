"""``--reasoning-parser``: a thinking model's ``<think>...</think>`` split out of the reply.

Models that think first (DeepSeek-R1, Qwen3, SmolLM3...) write their reasoning
between ``<think>`` and ``</think>`` and then the answer. With a reasoning
parser the server returns the first part as ``reasoning_content`` (in the
message, and in the stream's deltas) and only the answer as ``content``; a
request's ``include_reasoning: false`` drops the reasoning. Two parsers, by
vLLM's names:

* ``deepseek_r1``: the reply starts inside the reasoning whether or not it
  writes ``<think>`` (DeepSeek-R1's template opens the tag in the prompt);
  everything up to ``</think>`` is reasoning. A reply that never closes the
  tag is all reasoning.
* ``qwen3``: the reply is reasoning only if it opens with ``<think>``;
  otherwise all of it is content (a Qwen3 model asked not to think).

The split is made on the text, so it works whether or not the tags are
special tokens of the tokenizer. While streaming, a tail that could be the
start of a tag is held back until the next text decides.
"""

from __future__ import annotations

from paged.serve.chat_output import DeltaMessage, held_prefix

START, END = "<think>", "</think>"


class ThinkParser:
    """One reply's reasoning and content, fed as text deltas (see the module's docstring).

    Args:
        implicit_start: the reply starts inside the reasoning (``deepseek_r1``) rather than only
            after an opening ``<think>`` (``qwen3``).
    """

    def __init__(self, implicit_start: bool) -> None:
        self.implicit_start = implicit_start
        self.state = "start"  # "start" (nothing decided yet), "reasoning", "content"
        self.pending = ""

    def feed(self, text: str) -> DeltaMessage:
        self.pending += text
        out = DeltaMessage()
        if self.state == "start":
            if self.pending.startswith(START):
                self.pending, self.state = self.pending[len(START):], "reasoning"
            elif START.startswith(self.pending):
                return out  # may still become the opening tag
            else:
                self.state = "reasoning" if self.implicit_start else "content"
        if self.state == "reasoning":
            end = self.pending.find(END)
            if end < 0:
                keep = held_prefix(self.pending, END)
                out.reasoning, self.pending = self.pending[:len(self.pending) - keep], self.pending[
                    len(self.pending) - keep:]
                return out
            out.reasoning, self.pending, self.state = self.pending[:end], self.pending[end + len(END):], "content"
        out.content, self.pending = self.pending, ""
        return out

    def finish(self) -> DeltaMessage:
        """What was held back: a tail that turned out not to be a tag."""
        rest, self.pending = self.pending, ""
        if self.state == "reasoning" or (self.state == "start" and self.implicit_start):
            return DeltaMessage(reasoning=rest)
        return DeltaMessage(content=rest)


PARSERS = {"deepseek_r1": lambda: ThinkParser(implicit_start=True),
           "qwen3": lambda: ThinkParser(implicit_start=False)}
