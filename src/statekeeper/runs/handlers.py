"""State-handler agents: OneValet-style handlers, declared input fields and approval.

A `StateHandlerAgent` implements the `Agent` protocol. It keeps its own *handler state*
(an `AgentStatus` or a custom state of its `TransitionTable`) in the run's metadata under
``handler.<agent name>``, with the collected fields, the fields last asked for, whether
they were approved, a sub-state and free-form data. Each step calls ``on_<state>``:

    handler state          handler                    what the run does
    initializing           on_initializing            first step: collect, then go on
    waiting_for_input      on_waiting_for_input       AskInput -> WAITING_FOR_INPUT
    waiting_for_approval   on_waiting_for_approval    AskInput (yes/no) -> WAITING_FOR_INPUT
    running                on_running                 Respond steps again, Finish COMPLETED
    paused                 on_paused                  AskInput -> WAITING_FOR_INPUT
    error                  on_error                   re-raises -> ERROR, or recovers
    <custom state>         on_<custom state>          whatever it returns

The runner is RUNNING while the agent steps, and its WAITING_FOR_APPROVAL is for tool
calls: a handler's approval is a yes/no question, so the run waits in WAITING_FOR_INPUT
while the handler state says ``waiting_for_approval``; a "no" returns `Cancel`, so the run
ends CANCELLED. Agents see a copy of the run state: the handler state is saved in the
``metadata`` of the action each step returns, which the runner checkpoints with the step,
so a resumed run (in any process) goes on where it stopped. A step that raises saves
nothing. `Finish` moves the handler to COMPLETED, `Cancel` to CANCELLED (through PAUSED
when the table wants it, like the runner's own cancel).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import replace
from typing import Any, ClassVar

from pydantic import JsonValue

from statekeeper.core.lifecycle import DEFAULT_TRANSITIONS, AgentStatus, TransitionTable
from statekeeper.core.messages import Message, Role
from statekeeper.errors import (
    InvalidInputError,
    InvalidPayloadError,
    InvalidTransitionError,
    StatekeeperError,
)
from statekeeper.runs.agent import (
    Action,
    AskInput,
    Cancel,
    Finish,
    RateLimited,
    Respond,
    StepInput,
)
from statekeeper.runs.fields import MISSING, InputField, Missing
from statekeeper.runtime.profiles import AllProfilesCoolingDownError

__all__ = ["MISSING", "HandlerContext", "HandlerError", "InputField", "StateHandlerAgent"]

S = AgentStatus


_CURRENT: ContextVar[HandlerContext | None] = ContextVar("statekeeper_handler", default=None)
_YES = {"yes", "y", "yeah", "yep", "sure", "ok", "okay", "approve", "confirm", "go ahead"}
_NO = {"no", "n", "nope", "nah", "cancel", "reject", "deny", "decline", "stop", "don't"}


class HandlerError(StatekeeperError):
    """A handler ended the run in ERROR (``make_result(AgentStatus.ERROR, message)``)."""


def _current(agent: object, what: str, error: type[Exception] = RuntimeError) -> HandlerContext:
    ctx = _CURRENT.get()
    if ctx is None or ctx.agent is not agent:
        raise error(f"{what} is only available while the agent is handling a step")
    return ctx


class HandlerContext:
    """One step of a `StateHandlerAgent`: what its handler sees, and helpers for actions.

    ``run`` is the `StepInput`; ``text`` the user's text in this step's new input;
    ``fields`` the collected values. ``state``, ``fields``, ``asking``, ``approved``,
    ``sub_state`` and ``data`` (JSON) are saved with the step's action.
    """

    def __init__(self, agent: StateHandlerAgent, run: StepInput) -> None:
        self.agent, self.run = agent, run
        saved = run.state.metadata.get(agent.metadata_key)
        data = saved if isinstance(saved, dict) else {}
        table, stored = agent.transitions, data.get("state", S.INITIALIZING)
        try:
            self.state: str = table.parse(stored)
            table.allowed(self.state)
        except InvalidInputError as exc:
            raise InvalidPayloadError(
                f"agent {agent.name}: saved handler state {stored!r} does not fit its "
                f"transition table ({exc})"
            ) from exc
        fields, asking, extra = data.get("fields"), data.get("asking"), data.get("data")
        self.fields: dict[str, JsonValue] = dict(fields) if isinstance(fields, dict) else {}
        asking = asking if isinstance(asking, list) else []
        self.asking: list[str] = [name for name in asking if isinstance(name, str)]
        self.approved: bool = data.get("approved") is True
        self.sub_state: str | None = _str(data.get("sub_state"))
        self.paused_from: str | None = _str(data.get("paused_from"))
        self.data: dict[str, JsonValue] = dict(extra) if isinstance(extra, dict) else {}
        self.error: Exception | None = None
        self.text = "\n".join(m.text for m in run.new_input if m.role == Role.USER).strip()

    def snapshot(self) -> dict[str, JsonValue]:
        """What is saved in the run's metadata after this step."""
        return {
            "state": str(self.state),
            "fields": dict(self.fields),
            "asking": list[JsonValue](self.asking),
            "approved": self.approved,
            "sub_state": self.sub_state,
            "paused_from": self.paused_from,
            "data": dict(self.data),
        }

    def missing_fields(self) -> list[str]:
        """Declared fields not collected yet, in declaration order."""
        return [name for name in self.agent.input_fields if name not in self.fields]

    def transition_to(self, target: str) -> str:
        """Move to ``target`` (a state of the table) if the agent's `can_transition` allows
        it; else raise `InvalidTransitionError`, changing nothing."""
        table = self.agent.transitions
        state = table.parse(target)
        table.allowed(state)  # a state of this table
        if not self.agent.can_transition(self.state, state):
            allowed = frozenset(
                str(s) for s in table.states if self.agent.can_transition(self.state, s)
            )
            raise InvalidTransitionError(str(self.state), str(state), allowed)
        if state == S.PAUSED and self.state != S.PAUSED:
            self.paused_from = str(self.state)
        self.state = state
        return state

    def ask(self, prompt: str, fields: Sequence[str] = ()) -> AskInput:
        """Wait for the user; the answer goes to ``fields`` (see `extract_fields`)."""
        self.asking = list(fields)
        return AskInput(prompt, tuple(fields))

    def reply(self, text: str | None = None) -> Respond:
        """Say ``text`` (if any) and step again at once."""
        return Respond([Message.assistant(text)] if text else [])

    def complete(self, output: JsonValue | Missing = MISSING, message: str | None = None) -> Finish:
        """Finish the run; the output defaults to the collected fields."""
        value = dict(self.fields) if isinstance(output, Missing) else output
        return Finish(value, Message.assistant(message) if message else None)

    def cancel(self, reason: str = "cancelled", message: str | None = None) -> Cancel:
        """End the run CANCELLED (``reason`` is kept in its metadata as cancel_reason)."""
        return Cancel(reason, Message.assistant(message) if message else None)

    def make_result(
        self,
        status: str,
        message: str | None = None,
        *,
        output: JsonValue | Missing = MISSING,
        fields: Sequence[str] = (),
        wait: bool | None = None,
    ) -> Action:
        """The action for moving to ``status`` (OneValet's ``make_result``).

        COMPLETED finishes (output: ``output``, else the fields), CANCELLED cancels, ERROR
        raises `HandlerError`. Other states are entered (if not already in) and then
        RUNNING steps again at once, any other state waits for the user (``wait``
        overrides), with ``message`` as the reply or prompt.
        """
        state = self.agent.transitions.parse(status)
        if state == S.COMPLETED:
            return self.complete(output, message)
        if state == S.CANCELLED:
            return self.cancel(message or "cancelled", message)
        if state == S.ERROR:
            raise HandlerError(message or f"agent {self.agent.name} failed")
        if state != self.state:
            self.transition_to(state)
        if wait is False or (wait is None and state == S.RUNNING):
            return self.reply(message)
        return self.ask(message or "", fields)


class StateHandlerAgent:
    """An agent written as state handlers; see the module docstring.

    Class options (or ``__init__`` arguments): ``name``, ``transitions`` (a
    `TransitionTable` that must have INITIALIZING), ``requires_approval``,
    ``ask_all_fields`` (ask every missing field in one prompt) and ``skip_words``.
    """

    name: str = ""
    transitions: TransitionTable = DEFAULT_TRANSITIONS
    requires_approval: bool = False
    ask_all_fields: bool = False
    skip_words: frozenset[str] = frozenset({"skip", "-"})
    input_fields: ClassVar[dict[str, InputField]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        found: dict[str, InputField] = {}
        for klass in reversed(cls.__mro__):
            for key, value in vars(klass).items():
                if isinstance(value, InputField):
                    found[key] = value
                elif key in found:
                    del found[key]  # a subclass replaced the field
        cls.input_fields = found

    def __init__(
        self,
        name: str | None = None,
        *,
        transitions: TransitionTable | None = None,
        requires_approval: bool | None = None,
        ask_all_fields: bool | None = None,
    ) -> None:
        self.name = name or type(self).name or type(self).__name__
        if transitions is not None:
            self.transitions = transitions
        if S.INITIALIZING not in self.transitions.states:
            raise InvalidInputError(f"agent {self.name}: the table needs an initializing state")
        if requires_approval is not None:
            self.requires_approval = requires_approval
        if ask_all_fields is not None:
            self.ask_all_fields = ask_all_fields

    def _step_fields(self, what: str) -> dict[str, JsonValue]:
        # What an `InputField` reads and writes: the fields of the step being handled.
        return _current(self, what, AttributeError).fields

    @property
    def metadata_key(self) -> str:
        """Where the handler's state lives in ``RunState.metadata``."""
        return f"handler.{self.name}"

    async def step(self, run: StepInput) -> Action:
        """Call the handler of the current handler state; save its state in the action."""
        ctx = HandlerContext(self, run)
        token = _CURRENT.set(ctx)
        try:
            try:
                action = await self.dispatch(ctx)
            except (RateLimited, AllProfilesCoolingDownError):
                raise  # the runner's to handle (rotate the profile, or pause the run)
            except Exception as exc:
                if ctx.state == S.ERROR or not self._allows(ctx.state, S.ERROR):
                    raise
                ctx.transition_to(S.ERROR)
                ctx.error = exc
                action = await self.on_error(ctx)
            if isinstance(action, Finish) and ctx.state != S.COMPLETED:
                ctx.transition_to(S.COMPLETED)
            elif isinstance(action, Cancel) and ctx.state != S.CANCELLED:
                if not self._allows(ctx.state, S.CANCELLED) and self._allows(ctx.state, S.PAUSED):
                    ctx.transition_to(S.PAUSED)
                ctx.transition_to(S.CANCELLED)
        finally:
            _CURRENT.reset(token)
        metadata = {**(action.metadata or {}), self.metadata_key: ctx.snapshot()}
        return replace(action, metadata=metadata)

    async def dispatch(self, ctx: HandlerContext) -> Action:
        """Call ``on_<state>`` for the handler's current state."""
        handler = getattr(self, f"on_{ctx.state}", None)
        if handler is None:
            raise InvalidInputError(
                f"agent {self.name} has no handler on_{ctx.state} for its state {ctx.state!r}"
            )
        action: Action = await handler(ctx)
        return action

    def can_transition(self, source: str, target: str) -> bool:
        """Whether the handler may move from ``source`` to ``target``. Override hook."""
        return self.transitions.allows(source, target)

    def _allows(self, source: str, target: str) -> bool:
        return target in self.transitions.states and self.can_transition(source, target)

    # -- OneValet-style shortcuts for the step being handled ------------------------------

    def transition_to(self, target: str) -> str:
        """`HandlerContext.transition_to` for the current step."""
        return _current(self, "transition_to").transition_to(target)

    def make_result(self, status: str, message: str | None = None, **options: Any) -> Action:
        """`HandlerContext.make_result` for the current step."""
        return _current(self, "make_result").make_result(status, message, **options)

    @property
    def sub_state(self) -> str | None:
        """The current step's sub-state (saved across steps and resumes)."""
        return _current(self, "sub_state").sub_state

    @sub_state.setter
    def sub_state(self, value: str | None) -> None:
        _current(self, "sub_state").sub_state = value

    # -- field collection ----------------------------------------------------------------

    def extract_fields(
        self, ctx: HandlerContext, text: str, asking: Sequence[str]
    ) -> dict[str, str]:
        """The answers in ``text`` (field -> raw text). Override for smarter extraction.

        ``name: value`` lines set any field; otherwise one asked field takes the whole
        text, several asked fields take one non-empty line each, in order.
        """
        names = {n.lower(): n for n in self.input_fields}
        found: dict[str, str] = {}
        for line in text.splitlines():
            key, colon, value = line.partition(":")
            name = names.get(key.strip().lower().replace(" ", "_"))
            if colon and name:
                found[name] = value.strip()
        if found or not asking:
            return found
        if len(asking) == 1:
            return {asking[0]: text}
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return dict(zip(asking, lines, strict=True)) if len(lines) == len(asking) else {}

    def collect(self, ctx: HandlerContext, answers: Mapping[str, str]) -> list[str]:
        """Validate ``answers`` into ``ctx.fields``; returns one line per invalid answer."""
        errors: list[str] = []
        for name, text in answers.items():
            field = self.input_fields.get(name)
            if field is None:
                continue
            try:
                ctx.fields[name] = field.validate(text, self.skip_words)
            except ValueError as exc:
                errors.append(f"Invalid {name} ({exc}).")
            else:
                ctx.approved = False  # an approval covers the values it was shown
        return errors

    def field_prompt(self, asked: Sequence[str], errors: Sequence[str] = ()) -> str:
        """The prompt asking for ``asked``, after the ``errors`` of the last answer."""
        if len(asked) == 1:
            body = self.input_fields[asked[0]].prompt
        else:
            body = "Please answer, one per line or as 'name: value':\n" + "\n".join(
                f"- {n}: {self.input_fields[n].prompt}" for n in asked
            )
        return "\n".join([*errors, body])

    async def proceed(self, ctx: HandlerContext, errors: Sequence[str] = ()) -> Action:
        """After collecting: ask for what is missing, then for approval, then run."""
        missing = ctx.missing_fields()
        if missing:
            if ctx.state != S.WAITING_FOR_INPUT:
                ctx.transition_to(S.WAITING_FOR_INPUT)
            asked = missing if self.ask_all_fields else missing[:1]
            return ctx.ask(self.field_prompt(asked, errors), asked)
        if self.requires_approval and not ctx.approved:
            if ctx.state != S.WAITING_FOR_APPROVAL:
                ctx.transition_to(S.WAITING_FOR_APPROVAL)
            return ctx.ask(self.get_approval_prompt())
        ctx.transition_to(S.RUNNING)
        return await self.dispatch(ctx)

    def get_approval_prompt(self) -> str:
        """The yes/no question asked before running. Override to word it."""
        fields = _current(self, "get_approval_prompt").fields
        values = ", ".join(f"{name}: {value}" for name, value in fields.items())
        return f"Please confirm ({values or 'no details'}). Go ahead? (yes/no)"

    def parse_approval(self, text: str) -> bool | None:
        """True for a yes, False for a no, None when the answer is neither."""
        words = re.findall(r"[\w']+", text.lower())
        if not words:
            return None
        for answer, vocabulary in ((True, _YES), (False, _NO)):
            if " ".join(words) in vocabulary or words[0] in vocabulary:
                return answer
        return None

    # -- default handlers ----------------------------------------------------------------

    async def on_initializing(self, ctx: HandlerContext) -> Action:
        """Take ``name: value`` lines of the first input, then `proceed`."""
        return await self.proceed(ctx, self.collect(ctx, self.extract_fields(ctx, ctx.text, ())))

    async def on_waiting_for_input(self, ctx: HandlerContext) -> Action:
        """Collect the answer to the fields asked, then `proceed` (asking again if needed)."""
        if not ctx.run.new_input:  # resumed without input (after a limit, say): ask again
            return await self.proceed(ctx)
        answers = self.extract_fields(ctx, ctx.text, ctx.asking)
        errors = self.collect(ctx, answers)
        if ctx.asking and not answers:
            errors.append("Sorry, I could not match your answer to the questions.")
        return await self.proceed(ctx, errors)

    async def on_waiting_for_approval(self, ctx: HandlerContext) -> Action:
        """Yes runs, no cancels the run, anything else asks again."""
        decision = self.parse_approval(ctx.text)
        if decision is None:
            return ctx.ask(f"Please answer yes or no.\n{self.get_approval_prompt()}")
        if not decision:
            return ctx.cancel("rejected by the user", "Cancelled.")
        ctx.approved = True
        ctx.transition_to(S.RUNNING)
        return await self.dispatch(ctx)

    async def on_running(self, ctx: HandlerContext) -> Action:
        """The task itself. Default: finish with the collected fields as the output."""
        return ctx.complete()

    async def on_paused(self, ctx: HandlerContext) -> Action:
        """Any input goes back to the state paused in (a waiting state asks again)."""
        back = ctx.transition_to(ctx.paused_from or S.RUNNING)
        if back in (S.WAITING_FOR_INPUT, S.WAITING_FOR_APPROVAL):
            return await self.proceed(ctx)
        return await self.dispatch(ctx)

    async def on_error(self, ctx: HandlerContext) -> Action:
        """A handler raised ``ctx.error``. Default: re-raise (the run ends in ERROR)."""
        raise ctx.error or HandlerError(f"agent {self.name} is in its error state")


def _str(value: JsonValue) -> str | None:
    return value if isinstance(value, str) else None
