"""A small ADK app for the runtime tests: an `LlmAgent` whose model is scripted (no
network) and a function tool that writes state in every scope. Imported by the tests and
run as a subprocess: ``python adk_app.py STORE_URL TENANT SESSION_ID MESSAGE`` sends one
message through a fresh `Runner` and prints the replies and the session as JSON."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncGenerator
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.models import BaseLlm, LlmRequest, LlmResponse
from google.adk.runners import Runner
from google.adk.sessions import BaseSessionService
from google.adk.tools import ToolContext
from google.genai import types

from statekeeper.integrations.adk import StatekeeperSessionService

APP = "notes"
USER = "ada"


def remember(item: str, tool_context: ToolContext) -> dict[str, Any]:
    """Remember an item (the tool the scripted model calls)."""
    items = [*tool_context.state.get("items", []), item]
    tool_context.state["items"] = items  # session scope
    tool_context.state["user:remembered"] = tool_context.state.get("user:remembered", 0) + 1
    tool_context.state["app:last_item"] = item
    tool_context.state["temp:scratch"] = f"working on {item}"  # never stored
    return {"stored": item, "count": len(items)}


class ScriptedModel(BaseLlm):
    """Answers from the request alone, so any process gives the same answer: a new user
    message makes it call ``remember``; a tool result makes it reply with what the whole
    history it was sent holds (which proves the history was reloaded)."""

    model: str = "scripted"

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        last = llm_request.contents[-1]
        parts = last.parts or []
        response = next((p.function_response for p in parts if p.function_response), None)
        if response is None:
            text = "".join(p.text or "" for p in parts)
            call = types.FunctionCall(
                name="remember", args={"item": text.removeprefix("remember ")}
            )
            yield LlmResponse(
                content=types.Content(role="model", parts=[types.Part(function_call=call)])
            )
            return
        said = [
            p.text
            for c in llm_request.contents
            if c.role == "user"
            for p in c.parts or []
            if p.text
        ]
        reply = f"noted {response.response['stored']}; user turns so far: {len(said)}"
        yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=reply)]))


def make_runner(service: BaseSessionService) -> Runner:
    agent = LlmAgent(
        name="keeper",
        model=ScriptedModel(),
        instruction="Remember what the user asks you to.",
        tools=[remember],
    )
    return Runner(app_name=APP, agent=agent, session_service=service)


async def send(runner: Runner, session_id: str, text: str) -> list[str]:
    """One user turn; the texts the agent replied."""
    message = types.Content(role="user", parts=[types.Part(text=text)])
    replies: list[str] = []
    async for event in runner.run_async(user_id=USER, session_id=session_id, new_message=message):
        if event.content and event.content.parts:
            replies += [p.text for p in event.content.parts if p.text]
    return replies


async def main(url: str, tenant: str, session_id: str, text: str) -> None:
    async with StatekeeperSessionService.from_url(url, tenant=tenant) as service:
        replies = await send(make_runner(service), session_id, text)
        session = await service.get_session(app_name=APP, user_id=USER, session_id=session_id)
        assert session is not None
        print(
            json.dumps(
                {
                    "replies": replies,
                    "state": session.state,
                    "events": [e.model_dump(mode="json") for e in session.events],
                }
            )
        )


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
