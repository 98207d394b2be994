"""A scripted model, an agent with a tool that needs approval, and a command line for
the tests that run the OpenAI Agents SDK adapter in other processes.

    python oai_app.py URL add SESSION TENANT WRITER BATCHES   # add_items, one batch at a time
    python oai_app.py URL items SESSION TENANT LIMIT...       # get_items per limit ('': none)
    python oai_app.py URL resume RUN_ID TENANT SESSION         # restore, run, print the outcome
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, ModelResponse, RunConfig, Runner, function_tool
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
)
from openai.types.responses.response_reasoning_item import Summary

from statekeeper.integrations.openai_agents import RunStateStore, StatekeeperSession
from statekeeper.stores import open_store

RUN_CONFIG = RunConfig(tracing_disabled=True)


class ScriptedModel(Model):
    """A model that answers each call with the next canned output; records its inputs."""

    def __init__(self, turns: list[list[Any]]) -> None:
        self.turns = list(turns)
        self.inputs: list[Any] = []

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[Any],
        model_settings: Any,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: Any,
        **options: Any,
    ) -> ModelResponse:
        self.inputs.append(json.loads(json.dumps(input)))
        if not self.turns:
            raise AssertionError("the scripted model ran out of turns")
        return ModelResponse(output=self.turns.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the scripted model does not stream")


def say(text: str, n: int = 1) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id=f"msg_{n}",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


def call(name: str, arguments: dict[str, Any], n: int = 1) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        id=f"fc_{n}",
        type="function_call",
        call_id=f"call_{n}",
        name=name,
        arguments=json.dumps(arguments),
    )


def think(text: str, n: int = 1) -> ResponseReasoningItem:
    return ResponseReasoningItem(
        id=f"rs_{n}", type="reasoning", summary=[Summary(type="summary_text", text=text)]
    )


@function_tool(needs_approval=True)
def delete_file(path: str) -> str:
    """Delete a file (asks a human first)."""
    return f"deleted {path}"


@function_tool
def lookup(order: int) -> str:
    """Look an order up."""
    return f"order {order} left the depot"


def approval_turns() -> list[list[Any]]:
    """Reason, ask to delete a file (needs approval), then answer after the result."""
    return [
        [think("the user wants a file gone"), call("delete_file", {"path": "/tmp/report.txt"})],
        [say("Done: the file is gone.", 2)],
    ]


def make_agent(model: Model) -> Agent[Any]:
    return Agent(name="ops", instructions="Help.", model=model, tools=[delete_file, lookup])


async def main(argv: list[str]) -> None:
    url, command, *rest = argv
    async with await open_store(url) as store:
        if command == "add":
            session_id, tenant, writer, batches = rest
            session = StatekeeperSession(session_id, store, tenant=tenant)
            for n in range(int(batches)):
                await session.add_items([{"by": writer, "n": n, "i": i} for i in range(3)])
        elif command == "items":
            session_id, tenant, *limits = rest
            session = StatekeeperSession(session_id, store, tenant=tenant)
            for limit in limits:  # one process reads with every limit (each starts slowly)
                print(json.dumps(await session.get_items(int(limit) if limit else None)))
        elif command == "resume":
            run_id, tenant, session_id = rest
            agent = make_agent(ScriptedModel(approval_turns()[1:]))
            runs = RunStateStore(store, tenant=tenant)
            state = await runs.restore(run_id, agent)
            session = StatekeeperSession(session_id, store, tenant=tenant)
            result = await Runner.run(agent, state, session=session, run_config=RUN_CONFIG)
            await runs.update(run_id, result)
            print(json.dumps({"final": result.final_output, "items": await session.get_items()}))
        else:
            raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
