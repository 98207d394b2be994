"""ADK events for the tests: a plain one, and one with every field of `Event` set."""

from __future__ import annotations

from typing import Any

from google.adk.events import Event, EventActions
from google.genai import types

BASE = 4_000_000_000.0
"""Event timestamps count from here: later than any session's creation time, so every
service orders sessions the same way whatever the clock says."""


def event(
    n: int, *, author: str = "user", delta: dict[str, Any] | None = None, **extra: Any
) -> Event:
    """The n-th event of a scenario: fixed id, invocation and timestamp."""
    role = "user" if author == "user" else "model"
    return Event(
        id=f"e{n}",
        invocation_id=f"inv{n}",
        author=author,
        timestamp=BASE + n,
        content=types.Content(role=role, parts=[types.Part(text=f"text {n}")]),
        actions=EventActions(state_delta=dict(delta or {})),
        **extra,
    )


def full_event() -> Event:
    """An event with every field of `Event` (and of its actions) set to a non-default
    value, including bytes, sets, nested models, None inside a dict and unicode."""
    call = types.FunctionCall(id="call-1", name="lookup", args={"q": "ünïcode ✓", "n": None})
    return Event.model_validate(
        {
            "model_version": "scripted-1",
            "content": types.Content(
                role="model",
                parts=[
                    types.Part(text="thinking", thought=True),
                    types.Part(function_call=call),
                    types.Part(
                        function_response=types.FunctionResponse(
                            id="call-1", name="lookup", response={"rows": [1, 2.5, None]}
                        )
                    ),
                    types.Part(inline_data=types.Blob(mime_type="image/png", data=b"\x00\xffPNG")),
                ],
            ),
            "grounding_metadata": types.GroundingMetadata(web_search_queries=["q1"]),
            "partial": False,
            "turn_complete": True,
            "turn_complete_reason": types.TurnCompleteReason.NEED_MORE_INPUT,
            "interaction_status": list(types.InteractionStatus)[-1],
            "finish_reason": types.FinishReason.STOP,
            "error_code": "E42",
            "error_message": "an error message",
            "interrupted": True,
            "custom_metadata": {"trace": {"id": "t-1", "spans": [1, 2]}, "none": None},
            "usage_metadata": types.GenerateContentResponseUsageMetadata(
                prompt_token_count=12, candidates_token_count=3, total_token_count=15
            ),
            "live_session_resumption_update": types.LiveServerSessionResumptionUpdate(
                new_handle="h-1", resumable=True
            ),
            "live_session_id": "live-1",
            "go_away": types.LiveServerGoAway(time_left="5s"),
            "voice_activity": types.VoiceActivity(
                voice_activity_type=list(types.VoiceActivityType)[-1]
            ),
            "input_transcription": types.Transcription(text="heard", finished=True),
            "output_transcription": types.Transcription(text="said", finished=False),
            "avg_logprobs": -0.25,
            "logprobs_result": types.LogprobsResult(
                chosen_candidates=[types.LogprobsResultCandidate(token="a", log_probability=-0.1)]
            ),
            "cache_metadata": {
                "cache_name": "projects/p/cachedContents/c1",
                "invocations_used": 2,
                "contents_count": 3,
                "expire_time": BASE + 60,
                "fingerprint": "f",
            },
            "citation_metadata": types.CitationMetadata(
                citations=[types.Citation(uri="https://example.org", start_index=1, end_index=4)]
            ),
            "interaction_id": "ia-1",
            "environment_id": "env-1",
            "invocation_id": "inv-full",
            "author": "keeper",
            "actions": {
                "skip_summarization": True,
                "state_delta": {"k": [1, {"x": None}], "app:a": 1.5, "user:u": "ü"},
                "artifact_delta": {"report.txt": 2},
                "transfer_to_agent": "other",
                "transfer_reason": "needs a specialist",
                "escalate": True,
                "requested_auth_configs": {
                    # credential_key given: without it ADK calls its own deprecated helper
                    "call-1": {
                        "auth_scheme": {"type": "http", "scheme": "bearer"},
                        "credential_key": "k-1",
                    }
                },
                "requested_tool_confirmations": {"call-1": {"hint": "sure?", "confirmed": False}},
                "compaction": {
                    "start_timestamp": BASE,
                    "end_timestamp": BASE + 1,
                    "compacted_content": types.Content(
                        role="model", parts=[types.Part(text="sum")]
                    ),
                },
                "end_of_agent": True,
                "agent_state": {"step": 3},
                "rewind_before_invocation_id": "inv-0",
                "route": ["a", 1, True],
                "render_ui_widgets": [
                    {"id": "w1", "provider": "mcp", "payload": {"uri": "ui://w"}}
                ],
                "set_model_response": {"answer": 42},
            },
            "output": {"result": [1, "two", None]},
            "node_info": {
                "path": "wf/A@1/B@1",
                "output_for": ["wf/A@1"],
                "message_as_output": True,
            },
            "long_running_tool_ids": {"call-2", "call-1"},
            "branch": "root.keeper",
            "isolation_scope": "call-1",
            "id": "e-full",
            "timestamp": BASE + 0.123456,
        }
    )
