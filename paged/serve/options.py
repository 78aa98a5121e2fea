"""``ServeOptions``: the server-wide choices the endpoints read (tool and reasoning parsers, bounds, names).

``python -m paged.serve`` fills it from its flags (``cli.py``); ``build_app``
takes it (the defaults are a plain server: no parsers). Each parser is
checked here, once, so an unknown name stops the server at startup with the
list of the known ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paged.serve.chat_output import ChatParser
from paged.serve.reasoning import PARSERS as REASONING_PARSERS
from paged.serve.tool_parsers import PARSERS as TOOL_PARSERS
from paged.serve.tools import CallListParser, NamedCallParser, ToolPlan

DEFAULT_MAX_LOGPROBS = 20  # vLLM's --max-logprobs default, and SamplingParams.MAX_LOGPROBS
DEFAULT_RESPONSE_STORE = 256  # responses kept for previous_response_id (the oldest go first)


@dataclass
class ServeOptions:
    """What the server was started with, beyond the model and the engine.

    Attributes:
        enable_auto_tool_choice: ``tool_choice: "auto"`` is served (needs ``tool_call_parser``).
        tool_call_parser: the format the model writes calls in (``tool_parsers.PARSERS``).
        reasoning_parser: how the model marks its reasoning (``reasoning.PARSERS``), or None.
        max_logprobs: the most ``logprobs`` / ``top_logprobs`` a request may ask for.
        extra_model_names: more names clients may send as ``model`` (``--served-model-name a b``).
        response_store: how many responses ``previous_response_id`` can refer to.
        sampling_defaults: a request's defaults for the sampling fields it does not set
            (``temperature``, ``top_p``, ``top_k``, ``min_p``, ``repetition_penalty``): the model's
            generation config (``--generation-config``).
        docs: serve ``/docs`` and ``/openapi.json``.
    """

    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    max_logprobs: int = DEFAULT_MAX_LOGPROBS
    extra_model_names: list[str] = field(default_factory=list)
    response_store: int = DEFAULT_RESPONSE_STORE
    sampling_defaults: dict = field(default_factory=dict)
    docs: bool = True

    def __post_init__(self) -> None:
        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_PARSERS:
            raise ValueError(f"--tool-call-parser {self.tool_call_parser!r} is not known here; the parsers are "
                             f"{sorted(TOOL_PARSERS)}")
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser (the format the model writes "
                             f"its calls in: {sorted(TOOL_PARSERS)})")
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(f"--reasoning-parser {self.reasoning_parser!r} is not known here; the parsers are "
                             f"{sorted(REASONING_PARSERS)}")
        if not 0 <= self.max_logprobs <= DEFAULT_MAX_LOGPROBS:
            raise ValueError(f"--max-logprobs must be in [0, {DEFAULT_MAX_LOGPROBS}], got {self.max_logprobs}")
        if self.response_store < 0:
            raise ValueError(f"the response store holds >= 0 responses, got {self.response_store}")

    @property
    def auto_parser(self) -> str | None:
        """The tool parser serving ``tool_choice: "auto"``, or None when auto is not enabled."""
        return self.tool_call_parser if self.enable_auto_tool_choice else None

    def chat_parser(self, plan: ToolPlan, include_reasoning: bool, structured: bool):
        """A factory of per-choice ``ChatParser`` s for a reply under ``plan``, or None when the text is
        the content as it is (no reasoning parser, no tool calls to find).

        ``structured``: a grammar shapes the reply from its first token (a forced tool call, a response
        format). A parser that takes the reply for reasoning until ``</think>`` (``deepseek_r1``) would
        then take all of it, so it is not used; one that needs an opening ``<think>`` (``qwen3``) still
        splits a grammar's output that opens with one.
        """
        reasoning = REASONING_PARSERS.get(self.reasoning_parser) if self.reasoning_parser else None
        if reasoning is not None and structured and reasoning().implicit_start:
            reasoning = None
        auto = TOOL_PARSERS.get(self.tool_call_parser)
        tools = {"auto": auto and (lambda: auto(plan.allowed)), "required": CallListParser,
                 "named": lambda: NamedCallParser(plan.name)}.get(plan.mode)
        if reasoning is None and tools is None:
            return None
        return lambda: ChatParser(reasoning() if reasoning else None, tools() if tools else None, include_reasoning)
