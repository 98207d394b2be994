"""State-handler agents under the runner: fields, approval, transitions, sub-states."""

from __future__ import annotations

from typing import Any

import pytest

from statekeeper.core.lifecycle import DEFAULT_TRANSITIONS, AgentStatus, TransitionTable
from statekeeper.core.messages import Message
from statekeeper.errors import InvalidInputError, InvalidTransitionError
from statekeeper.runs import Action, Runner, RunResult
from statekeeper.runs.handlers import HandlerContext, InputField, StateHandlerAgent
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store

KEY = "handler.order"


def positive(value: Any) -> bool | str:
    return value > 0 or "must be more than zero"


class OrderAgent(StateHandlerAgent):
    name = "order"
    requires_approval = True
    item = InputField("What would you like to order?")
    quantity = InputField("How many?", parser=int, validator=positive)
    note = InputField("Any note for the kitchen?", default="")

    def get_approval_prompt(self) -> str:
        return f"Order {self.quantity} x {self.item}? (yes/no)"

    async def on_running(self, ctx: HandlerContext) -> Action:
        assert ctx.fields == {"item": self.item, "quantity": self.quantity, "note": self.note}
        order = {"item": self.item, "quantity": self.quantity, "note": self.note}
        return ctx.complete(order, f"Ordered {self.quantity} x {self.item}.")


def runner(store: Store, *agents: StateHandlerAgent) -> Runner:
    """A new runner each time, as another process would build it."""
    return Runner(store, "alice", list(agents) or [OrderAgent()])


def asked(result: RunResult) -> tuple[str, list[Any]]:
    last = result.new_messages[-1]
    fields = last.metadata.get("fields")
    assert isinstance(fields, list)
    return last.text, fields


def handler(result: RunResult, key: str = KEY) -> dict[str, Any]:
    saved = result.state.metadata[key]
    assert isinstance(saved, dict)
    return saved


async def order_until_approval(store: Store) -> RunResult:
    first = await runner(store).start("order", "hi, I am hungry")
    assert first.status == "waiting_for_input"
    assert asked(first) == ("What would you like to order?", ["item"])
    assert handler(first)["state"] == "waiting_for_input"

    run_id = first.run_id
    second = await runner(store).resume(run_id, "pizza")
    assert asked(second) == ("How many?", ["quantity"])
    assert handler(second)["fields"] == {"item": "pizza"}

    bad = await runner(store).resume(run_id, "lots")
    assert bad.status == "waiting_for_input"
    prompt, fields = asked(bad)
    assert fields == ["quantity"]
    assert prompt.startswith("Invalid quantity (")
    assert prompt.endswith("\nHow many?")
    zero = await runner(store).resume(run_id, "0")
    assert asked(zero) == ("Invalid quantity (must be more than zero).\nHow many?", ["quantity"])

    third = await runner(store).resume(run_id, "2")
    assert asked(third) == ("Any note for the kitchen?", ["note"])
    approval = await runner(store).resume(run_id, "skip")
    assert approval.status == "waiting_for_input"
    assert asked(approval) == ("Order 2 x pizza? (yes/no)", [])
    assert handler(approval)["state"] == "waiting_for_approval"
    assert handler(approval)["fields"] == {"item": "pizza", "quantity": 2, "note": ""}

    unclear = await runner(store).resume(run_id, "hmm, maybe")
    assert asked(unclear)[0] == "Please answer yes or no.\nOrder 2 x pizza? (yes/no)"
    return unclear


async def test_fields_are_collected_approved_and_completed(store: Store) -> None:
    waiting = await order_until_approval(store)
    done = await runner(store).resume(waiting.run_id, "Yes, please!")
    assert done.status == "completed"
    assert done.output == {"item": "pizza", "quantity": 2, "note": ""}
    assert done.new_messages[-1].text == "Ordered 2 x pizza."
    saved = handler(done)
    assert saved["state"] == "completed"
    assert saved["approved"] is True

    session = await SessionManager(store, "alice").get(done.state.session_id)
    texts = [m.text for m in await session.messages()]
    assert texts[:4] == ["hi, I am hungry", "What would you like to order?", "pizza", "How many?"]
    assert texts[-2:] == ["Yes, please!", "Ordered 2 x pizza."]


async def test_rejection_cancels_the_run(store: Store) -> None:
    waiting = await order_until_approval(store)
    cancelled = await runner(store).resume(waiting.run_id, "no")
    assert cancelled.status == "cancelled"
    assert cancelled.output is None
    assert cancelled.state.metadata["cancel_reason"] == "rejected by the user"
    assert handler(cancelled)["state"] == "cancelled"
    assert cancelled.new_messages[-1].text == "Cancelled."
    with pytest.raises(InvalidInputError):
        await runner(store).resume(waiting.run_id, "yes after all")


async def test_all_fields_at_once_and_fields_in_the_first_message(store: Store) -> None:
    agent = OrderAgent(ask_all_fields=True, requires_approval=False)
    first = await runner(store, agent).start("order", "Item: tea\nquantity: many")
    prompt, fields = asked(first)
    assert fields == ["quantity", "note"]
    assert prompt.startswith("Invalid quantity (")
    assert "- quantity: How many?\n- note: Any note for the kitchen?" in prompt
    assert handler(first)["fields"] == {"item": "tea"}

    waiting = await runner(store, OrderAgent(ask_all_fields=True)).resume(first.run_id, "3\nhot")
    assert waiting.status == "waiting_for_input"  # this instance asks for approval
    assert handler(waiting)["state"] == "waiting_for_approval"
    approved = await runner(store, agent).resume(first.run_id, "ok")
    assert approved.output == {"item": "tea", "quantity": 3, "note": "hot"}


async def test_field_values_are_only_there_during_a_step() -> None:
    agent = OrderAgent()
    assert isinstance(OrderAgent.item, InputField)
    assert list(OrderAgent.input_fields) == ["item", "quantity", "note"]
    assert not OrderAgent.note.required
    with pytest.raises(AttributeError):
        _ = agent.item
    with pytest.raises(RuntimeError):
        agent.transition_to(AgentStatus.RUNNING)
    assert agent.parse_approval("Sure.") is True
    assert agent.parse_approval("nope") is False
    assert agent.parse_approval("what?") is None


class Strict(StateHandlerAgent):
    """Goes back to WAITING_FOR_INPUT from RUNNING, unless ``strict`` forbids it."""

    name = "strict"
    strict = True

    def can_transition(self, source: str, target: str) -> bool:
        if self.strict and (source, target) == ("running", "waiting_for_input"):
            return False
        return super().can_transition(source, target)

    async def on_running(self, ctx: HandlerContext) -> Action:
        if ctx.text == "again":
            return ctx.complete("done")
        self.transition_to(AgentStatus.WAITING_FOR_INPUT)
        return ctx.ask("More details?")

    async def on_waiting_for_input(self, ctx: HandlerContext) -> Action:
        if ctx.text == "back to start":
            self.transition_to(AgentStatus.INITIALIZING)  # not allowed from here
        self.transition_to(AgentStatus.RUNNING)
        return ctx.complete({"details": ctx.text})


async def test_invalid_transitions_raise_and_change_nothing(store: Store) -> None:
    with pytest.raises(InvalidTransitionError) as caught:
        await runner(store, Strict()).start("strict", "go")
    assert (caught.value.source, caught.value.target) == ("running", "waiting_for_input")
    runs = await runner(store, Strict()).runs.list()
    failed = await runner(store, Strict()).load(runs[0].run_id)
    assert failed.status == "error"
    assert failed.error is not None
    assert failed.error.type == "InvalidTransitionError"
    assert "handler.strict" not in failed.metadata  # the failed step saved nothing

    lenient = Strict()
    lenient.strict = False
    waiting = await runner(store, lenient).start("strict", "go")
    assert waiting.status == "waiting_for_input"
    with pytest.raises(InvalidTransitionError):
        await runner(store, lenient).resume(waiting.run_id, "back to start")
    stopped = await runner(store, lenient).load(waiting.run_id)
    assert stopped.status == "error"
    assert handler(RunResult(stopped), "handler.strict")["state"] == "waiting_for_input"


REVIEW = DEFAULT_TRANSITIONS.with_state(
    "reviewing", to=["running", "waiting_for_input"], from_=["waiting_for_input"]
)


class Reviewed(StateHandlerAgent):
    name = "reviewed"
    transitions = REVIEW
    text = InputField("What should I publish?")

    async def proceed(self, ctx: HandlerContext, errors: Any = ()) -> Action:
        if ctx.missing_fields() or ctx.state == "reviewing":
            return await super().proceed(ctx, errors)
        return ctx.make_result("reviewing", f"Publish {self.text!r}? (ok/edit)")

    async def on_reviewing(self, ctx: HandlerContext) -> Action:
        if ctx.text == "ok":
            ctx.transition_to(AgentStatus.RUNNING)
            return ctx.complete({"published": self.text})
        del ctx.fields["text"]
        return await self.proceed(ctx)


async def test_custom_table_and_custom_state(store: Store) -> None:
    first = await runner(store, Reviewed()).start("reviewed", "hello")
    assert asked(first) == ("What should I publish?", ["text"])
    review = await runner(store, Reviewed()).resume(first.run_id, "draft")
    assert review.status == "waiting_for_input"
    assert asked(review) == ("Publish 'draft'? (ok/edit)", [])
    assert handler(review, "handler.reviewed")["state"] == "reviewing"
    edit = await runner(store, Reviewed()).resume(first.run_id, "edit")
    assert asked(edit) == ("What should I publish?", ["text"])
    again = await runner(store, Reviewed()).resume(first.run_id, "final")
    done = await runner(store, Reviewed()).resume(again.run_id, "ok")
    assert done.output == {"published": "final"}

    class Unknown(Reviewed):
        transitions = DEFAULT_TRANSITIONS

    with pytest.raises(InvalidInputError, match="reviewing"):
        await runner(store, Unknown("unknown")).start("unknown", "hi\ntext: x")
    with pytest.raises(InvalidInputError, match="initializing"):
        Reviewed(transitions=TransitionTable({"drafting": []}))


class Steps(StateHandlerAgent):
    """OneValet's sub-state example, plus a reply, a pause and data kept across resumes."""

    name = "steps"

    async def on_running(self, ctx: HandlerContext) -> Action:
        ctx.data["seen"] = [*(ctx.data.get("seen") or []), self.sub_state]
        if self.sub_state is None:
            self.sub_state = "step1"
            return ctx.reply("Starting.")
        if self.sub_state == "step1":
            self.sub_state = "step2"
            return self.make_result(AgentStatus.WAITING_FOR_INPUT, "Step 1 done. Ready?")
        if self.sub_state == "step2":
            self.sub_state = "step3"
            return ctx.make_result(AgentStatus.PAUSED, "Paused; say anything to go on.")
        return self.make_result(AgentStatus.COMPLETED, "All steps done.", output=ctx.data)


async def test_sub_states_survive_resume(store: Store) -> None:
    first = await runner(store, Steps()).start("steps", "go")
    assert first.status == "waiting_for_input"
    assert [m.text for m in first.new_messages] == ["go", "Starting.", "Step 1 done. Ready?"]
    saved = handler(first, "handler.steps")
    assert (saved["state"], saved["sub_state"]) == ("waiting_for_input", "step2")

    paused = await runner(store, Steps()).resume(first.run_id, "ready")
    saved = handler(paused, "handler.steps")
    assert (saved["state"], saved["sub_state"], saved["paused_from"]) == (
        "paused",
        "step3",
        "running",
    )
    done = await runner(store, Steps()).resume(first.run_id, Message.user("go on"))
    assert done.status == "completed"
    assert done.output == {"seen": [None, "step1", "step2", "step3"]}


class Fragile(StateHandlerAgent):
    name = "fragile"
    recover = False

    async def on_running(self, ctx: HandlerContext) -> Action:
        raise ValueError("the oven is broken")

    async def on_error(self, ctx: HandlerContext) -> Action:
        if not self.recover:
            return await super().on_error(ctx)
        return ctx.cancel(f"failed: {ctx.error}", "Sorry, I cannot do that.")


async def test_errors_end_the_run_or_are_handled(store: Store) -> None:
    with pytest.raises(ValueError, match="oven"):
        await runner(store, Fragile()).start("fragile", "bake")
    recovering = Fragile()
    recovering.recover = True
    result = await runner(store, recovering).start("fragile", "bake")
    assert result.status == "cancelled"
    assert result.state.metadata["cancel_reason"] == "failed: the oven is broken"
    assert handler(result, "handler.fragile")["state"] == "cancelled"


class Quitter(StateHandlerAgent):
    name = "quitter"

    async def on_running(self, ctx: HandlerContext) -> Action:
        return ctx.cancel("the user left")


async def test_cancel_from_running_goes_through_paused(store: Store) -> None:
    result = await runner(store, Quitter()).start("quitter", "bye")
    assert result.status == "cancelled"
    saved = handler(result, "handler.quitter")
    assert (saved["state"], saved["paused_from"]) == ("cancelled", "running")
