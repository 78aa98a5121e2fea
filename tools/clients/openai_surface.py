"""Run by ``tools/clients_check.py`` with the clients' python: an agent's tool loop and a Responses stream.

    python openai_surface.py BASE_URL MODEL

Clients written by others, unpatched, against the live server (which
``clients_check.py`` starts with ``--enable-auto-tool-choice --tool-call-parser
hermes``):

1. the ``openai-agents`` SDK runs an agent with one function tool, twice: over
   chat completions (``OpenAIChatCompletionsModel``) and over the Responses API
   (``OpenAIResponsesModel``). The first turn must call the tool
   (``tool_choice="required"``: the server forces a valid call); the SDK runs
   the tool and sends its output back; the next turn, told ``tool_choice:
   "none"`` by an agent hook (a 135M model asked with ``auto`` imitates the call
   it sees in its history, again and again), must end the loop with a text
   answer. A small model answers poorly; what is checked is that the protocol
   carries the loop to its end.
2. the official ``openai`` client streams a Responses answer
   (``responses.stream``) whose JSON output must parse.

It prints one JSON object (what happened, per check) and exits 1 if a check failed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # no traces are sent anywhere


async def agent_loop(base_url: str, model: str, api: str) -> dict:
    from dataclasses import replace

    from agents import (Agent, AgentHooks, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner,
                        function_tool, set_tracing_disabled)
    from openai import AsyncOpenAI

    class AnswerAfterTheTool(AgentHooks):
        async def on_tool_end(self, context, agent, tool, result) -> None:
            agent.model_settings = replace(agent.model_settings, tool_choice="none")

    set_tracing_disabled(True)
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"It is sunny in {city}, 21 C."

    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    wrapped = (OpenAIChatCompletionsModel(model=model, openai_client=client) if api == "chat"
               else OpenAIResponsesModel(model=model, openai_client=client))
    agent = Agent(name="weather", instructions="Answer with the weather.", tools=[get_weather], model=wrapped,
                  model_settings=ModelSettings(tool_choice="required", temperature=0.0, max_tokens=64),
                  reset_tool_choice=False, hooks=AnswerAfterTheTool())
    try:
        result = await Runner.run(agent, "What is the weather in Paris?", max_turns=4)
    finally:
        await client.close()
    kinds = [item.type for item in result.new_items]
    return {"api": api, "tool_calls": calls, "items": kinds, "final_output": str(result.final_output)[:200],
            "ok": bool(calls) and "tool_call_output_item" in kinds and isinstance(result.final_output, str)}


def responses_stream(base_url: str, model: str) -> dict:
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
              "additionalProperties": False}
    with client.responses.stream(model=model, input="Name a city, as JSON.", max_output_tokens=48, temperature=0,
                                 text={"format": {"type": "json_schema", "name": "city", "schema": schema}}) as s:
        kinds = [event.type for event in s]
        final = s.get_final_response()
    parsed = json.loads(final.output_text)
    return {"events": len(kinds), "first": kinds[:3], "last": kinds[-1], "output_text": final.output_text,
            "ok": kinds[0] == "response.created" and kinds[-1] == "response.completed" and "city" in parsed}


def main() -> int:
    base_url, model = sys.argv[1], sys.argv[2]
    async def loops() -> tuple[dict, dict]:
        return await agent_loop(base_url, model, "chat"), await agent_loop(base_url, model, "responses")

    chat, responses = asyncio.run(loops())
    report = {"agents_chat": chat, "agents_responses": responses, "responses_stream": responses_stream(base_url, model)}
    print(json.dumps(report))
    return 0 if all(r["ok"] for r in report.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
