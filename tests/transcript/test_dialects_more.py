"""Bedrock Converse (Strands), Gemini (google-genai, ADK events) and Claude Code transcript
entries: detected per message, their problems found, their dangling calls closed in their own
shape, and the repaired histories taken back by the frameworks' own request paths."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from checkpointer._transcript.dialects import detect
from checkpointer.messages import (
    CLOSED_CALL_TEXT,
    close_dangling_tool_calls,
    count_turns,
    validate_history,
)


def kinds(messages: list[Any]) -> list[tuple[str, int, str | None]]:
    return [(p.kind, p.index, p.call_id) for p in validate_history(messages)]


# -- the pieces of a conversation in each dialect (as JSON, what a store holds) ----------


class Converse:
    name = dialect = "converse"

    def user(self, text: str) -> Any:
        return {"role": "user", "content": [{"text": text}]}

    def answer(self, text: str) -> Any:
        return {"role": "assistant", "content": [{"text": text}]}

    def call(self, *ids: str) -> list[Any]:
        uses = [{"toolUse": {"toolUseId": i, "name": "lookup", "input": {"q": 2}}} for i in ids]
        return [{"role": "assistant", "content": [{"text": "let me look"}, *uses]}]

    def results(self, *ids: str) -> list[Any]:
        results = [
            {"toolResult": {"toolUseId": i, "status": "success", "content": [{"text": f"r {i}"}]}}
            for i in ids
        ]
        return [{"role": "user", "content": results}]


class Gemini:
    dialect = "gemini"

    def __init__(self, camel: bool, events: bool) -> None:
        self.camel, self.events = camel, events
        self.name = f"gemini-{'camel' if camel else 'snake'}{'-events' if events else ''}"

    def _message(self, role: str, parts: list[Any]) -> Any:
        content = {"role": role, "parts": parts}
        if not self.events:
            return content
        author = "user" if role == "user" else "agent"
        invocation = "invocationId" if self.camel else "invocation_id"
        return {"author": author, invocation: "i1", "timestamp": 1.5, "content": content}

    def _part(self, kind: str, body: dict[str, Any]) -> Any:
        camel = {"function_call": "functionCall", "function_response": "functionResponse"}
        return {camel[kind] if self.camel else kind: body}

    def user(self, text: str) -> Any:
        return self._message("user", [{"text": text}])

    def answer(self, text: str) -> Any:
        return self._message("model", [{"text": text}])

    def call(self, *ids: str) -> list[Any]:
        calls = [self._part("function_call", {"id": i, "name": "lookup", "args": {}}) for i in ids]
        return [self._message("model", [{"text": "let me look"}, *calls])]

    def results(self, *ids: str) -> list[Any]:
        body = [{"id": i, "name": "lookup", "response": {"output": f"r {i}"}} for i in ids]
        return [self._message("user", [self._part("function_response", b) for b in body])]


class ClaudeCode:
    """Entries as the CLI writes them: each block of a response an entry of its own (same
    ``message.id``), each result an entry whose parent is its call's entry."""

    name = dialect = "claude-code"

    def __init__(self) -> None:
        self.n = 0

    def _entry(self, kind: str, message: dict[str, Any], parent: str | None = None) -> Any:
        self.n += 1
        return {
            "type": kind,
            "uuid": f"u{self.n}",
            "parentUuid": parent or f"u{self.n - 1}",
            "isSidechain": False,
            "sessionId": "s1",
            "timestamp": "2026-12-02T03:00:00.000Z",
            "message": message,
        }

    def user(self, text: str) -> Any:
        return self._entry("user", {"role": "user", "content": text})

    def answer(self, text: str) -> Any:
        content = [{"type": "text", "text": text}]
        return self._entry(
            "assistant", {"id": f"msg{self.n}", "role": "assistant", "content": content}
        )

    def call(self, *ids: str) -> list[Any]:
        message_id = f"msg{self.n}"
        blocks: list[dict[str, Any]] = [{"type": "text", "text": "let me look"}]
        blocks += [{"type": "tool_use", "id": i, "name": "lookup", "input": {}} for i in ids]
        return [
            self._entry("assistant", {"id": message_id, "role": "assistant", "content": [b]})
            for b in blocks
        ]

    def results(self, *ids: str) -> list[Any]:
        return [
            self._entry(
                "user",
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": i, "content": f"r {i}"}],
                },
            )
            for i in ids
        ]


FORMS: list[Callable[[], Any]] = [
    Converse,
    *(lambda c=c, e=e: Gemini(c, e) for c in (False, True) for e in (False, True)),
    ClaudeCode,
]
NAMES = [
    "converse",
    "gemini-snake",
    "gemini-snake-events",
    "gemini-camel",
    "gemini-camel-events",
    "claude-code",
]
forms = pytest.mark.parametrize("make", FORMS, ids=NAMES)


def conversation(
    f: Any, *, drop: bool = False, orphan: bool = False, end_open: bool = False
) -> list[Any]:
    """A user asks, the model calls two tools, gets both answers, answers; then asks again."""
    history = [f.user("hi"), *f.call("c1", "c2")]
    history += [] if drop else f.results("c1", "c2")
    if end_open:
        return history
    history += [f.answer("done"), f.user("again")]
    history += f.results("c9") if orphan else []
    return [*history, f.answer("bye")]


@forms
def test_each_message_is_detected_and_a_complete_history_sendable(make: Any) -> None:
    """Every message of a sound history is read by the dialect; no problem; the turns count."""
    f = make()
    history = conversation(f)
    assert {getattr(detect(m), "name", None) for m in history} == {f.dialect}
    assert kinds(history) == []
    assert count_turns(history) == 3  # the call, "done", "bye": a split response is one turn


@forms
def test_dangling_dropped_and_orphan_results_are_found(make: Any) -> None:
    """A call left open at the end, results dropped mid-history, a result of no call."""
    f = make()
    open_end = conversation(f, end_open=True, drop=True)
    assert [k for k, *_ in kinds(open_end)] == ["unclosed-call", "unclosed-call"]
    assert [k for k, *_ in kinds(conversation(f, drop=True))] == ["unclosed-call"] * 2
    assert [(k, c) for k, _, c in kinds(conversation(f, orphan=True))] == [("orphan-result", "c9")]


@forms
def test_a_dangling_call_is_closed_in_its_dialect(make: Any) -> None:
    """The repair answers in the call's own shape, where its API wants it: sendable after."""
    f = make()
    for broken in (conversation(f, drop=True), conversation(f, drop=True, end_open=True)):
        repaired, count = close_dangling_tool_calls(broken)
        assert count == 2 and kinds(repaired) == []
        added = [m for m in repaired if not any(m is b for b in broken)]
        assert added and all(getattr(detect(m), "name", None) == f.dialect for m in added)
        assert CLOSED_CALL_TEXT in str(added)


def _unknown_blocks(name: str) -> list[Any]:
    """Known messages holding what their dialect does not know (each must be reported)."""
    if name == "converse":
        return [
            {"role": "assistant", "content": [{"toolUse": {"name": "f", "input": {}}}]},  # no id
            {"role": "assistant", "content": [{"text": "a"}, {"bogusBlock": {}}]},
            {
                "role": "user",
                "content": [{"toolUse": {"toolUseId": "x", "name": "f", "input": {}}}],
            },
            {"role": "assistant", "content": [{"text": "a", "toolUse": {"toolUseId": "y"}}]},
            {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"text": "b"}]},
        ]
    if name.startswith("gemini"):
        call = "functionCall" if "camel" in name else "function_call"
        return [
            {"role": "model", "parts": [{call: {"name": "f", "args": {}}}]},  # no id
            {"role": "model", "parts": [{"text": "a"}, {"bogus_part": 1}]},
            {"role": "user", "parts": [{call: {"id": "x", "name": "f", "args": {}}}]},
            {"role": "system", "parts": [{"text": "a"}]},
            {"author": "agent", "invocation_id": "i", "content": {"role": "model", "parts": [{}]}},
        ]
    return [
        {
            "type": "assistant",
            "uuid": "a",
            "message": {"role": "assistant", "content": [{"type": "bogus"}]},
        },
        {
            "type": "assistant",
            "uuid": "b",
            "message": {"content": [{"type": "tool_use", "name": "f"}]},
        },
        {"type": "user", "uuid": "c", "message": {"content": [{"type": "tool_use", "id": "x"}]}},
        {"type": "user", "uuid": "d", "message": None},
        {"type": "no-such-entry", "uuid": "e"},
    ]


@forms
def test_no_broken_history_passes_as_fine(make: Any) -> None:
    """Each broken history, and each unknown block inside a known message, is a problem: never
    a silent ok."""
    f = make()
    broken = [
        conversation(f, drop=True),
        conversation(f, drop=True, end_open=True),
        conversation(f, orphan=True),
        *([f.user("hi"), odd, f.answer("x")] for odd in _unknown_blocks(f.name)),
    ]
    for history in broken:
        assert validate_history(history), history
    for odd in _unknown_blocks(f.name):
        assert detect(odd) is None, odd


# -- the frameworks take the repaired histories back ---------------------------------------


def test_strands_builds_a_bedrock_request_of_the_repaired_history() -> None:
    """Strands' BedrockModel formats the repaired messages into a Converse request that
    botocore's model of the API validates (built offline, never sent)."""
    pytest.importorskip("strands")
    from botocore.validate import validate_parameters
    from strands.models.bedrock import BedrockModel

    repaired, count = close_dangling_tool_calls(conversation(Converse(), drop=True))
    assert count == 2
    model = BedrockModel(
        model_id="us.anthropic.claude-sonnet-4-20250514-v1:0", region_name="us-east-1"
    )
    request = model.format_request(repaired)
    shape = model.client.meta.service_model.operation_model("Converse").input_shape
    validate_parameters(request, shape)  # raises ParamValidationError on a bad shape
    answered = request["messages"][2]["content"]
    assert [b["toolResult"]["status"] for b in answered[:2]] == ["error", "error"]


@pytest.mark.parametrize("camel", [False, True], ids=["snake", "camel"])
def test_google_genai_and_adk_validate_the_repaired_contents(camel: bool) -> None:
    """google-genai's ``Content`` and ADK's ``Event`` validate every repaired message."""
    pytest.importorskip("google.adk")
    from google.adk.events import Event
    from google.genai import types

    for events in (False, True):
        repaired, count = close_dangling_tool_calls(conversation(Gemini(camel, events), drop=True))
        assert count == 2
        for message in repaired:
            (Event if events else types.Content).model_validate(message)
        closing = repaired[2]["content"] if events else repaired[2]
        parts = types.Content.model_validate(closing).parts or []
        assert [p.function_response.id for p in parts if p.function_response] == ["c1", "c2"]


def test_gemini_and_adk_objects_are_read_and_repaired_as_objects() -> None:
    """``types.Content`` and ``Event`` objects: detected, checked, answered with objects."""
    pytest.importorskip("google.adk")
    from google.adk.events import Event
    from google.genai import types

    for events in (False, True):
        dicts = conversation(Gemini(False, events), drop=True, end_open=True)
        objects = [(Event if events else types.Content).model_validate(m) for m in dicts]
        assert [k for k, *_ in kinds(objects)] == ["unclosed-call"] * 2
        repaired, count = close_dangling_tool_calls(objects)
        assert count == 2 and kinds(repaired) == []
        assert isinstance(repaired[-1], Event if events else types.Content)
        assert repaired[-1].model_dump(mode="json")  # a whole object, not a dict inside one


def test_the_claude_sdk_reads_the_closing_results_into_its_chain() -> None:
    """The Claude Agent SDK's own transcript reader (the parentUuid chain) keeps the result
    entries the repair adds."""
    pytest.importorskip("claude_agent_sdk")
    from claude_agent_sdk._internal.sessions import _build_conversation_chain

    repaired, count = close_dangling_tool_calls(conversation(ClaudeCode(), drop=True))
    chain = [e["uuid"] for e in _build_conversation_chain(repaired)]
    assert count == 2 and chain == [e["uuid"] for e in repaired]


def test_the_anthropic_shape_of_a_claude_code_repair() -> None:
    """The Messages API's own types take the inner messages of a repaired transcript."""
    anthropic = pytest.importorskip(
        "anthropic", reason="the anthropic SDK is not installed: no Messages API shape to check"
    )
    from pydantic import TypeAdapter

    repaired, _ = close_dangling_tool_calls(conversation(ClaudeCode(), drop=True))
    adapter: TypeAdapter[Any] = TypeAdapter(list[anthropic.types.MessageParam])  # type: ignore[name-defined]
    adapter.validate_python([e["message"] for e in repaired])


def test_claude_code_entries_that_are_not_turns_keep_the_window() -> None:
    """System, progress and attachment entries between a call and its result are not turns
    and end no window; a new response (another message id) does."""
    f = ClaudeCode()
    call = f.call("c1")
    aside = [
        {"type": "system", "uuid": "s", "parentUuid": "u3", "subtype": "x", "content": "hook"},
        {"type": "progress", "uuid": "p", "parentUuid": "s", "data": {}},
        {"type": "summary", "summary": "older", "leafUuid": "u1"},
        {"type": "file-history-snapshot", "messageId": "m", "snapshot": {}},
    ]
    assert kinds([f.user("hi"), *call, *aside, *f.results("c1"), f.answer("ok")]) == []
    another = f.answer("a second response, no result between")
    assert kinds([f.user("hi"), *call, another]) == [("unclosed-call", 2, "c1")]
    assert count_turns([f.user("hi"), *call, *aside]) == 1
    parallel = f.call("p1", "p2")
    first, second = f.results("p1", "p2")
    first["message"]["content"].append({"type": "text", "text": "a hook said this"})
    assert kinds([f.user("hi"), *parallel, first, second, f.answer("ok")]) == []


def test_a_langchain_system_message_is_still_langchain() -> None:
    """``{"type": "system"}`` without a uuid is LangChain's, not a Claude Code entry."""
    found = detect({"type": "system", "content": "be brief"})
    assert found is not None and found.name == "langchain"


# -- a call answered in another dialect, and blocks no API takes ---------------------------

_CHAT_CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
_BLOCK_RESULT = {"type": "tool_result", "tool_use_id": "c1", "content": "x"}
_ANSWERED: dict[str, tuple[list[Any], list[Any]]] = {  # a call c1, and its result
    "chat": (
        [{"role": "assistant", "content": None, "tool_calls": [_CHAT_CALL]}],
        [{"role": "tool", "tool_call_id": "c1", "content": "x"}],
    ),
    "anthropic": (
        [{"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "f"}]}],
        [{"role": "user", "content": [_BLOCK_RESULT]}],
    ),
    "responses": (
        [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}],
        [{"type": "function_call_output", "call_id": "c1", "output": "x"}],
    ),
    "langchain": (
        [{"type": "ai", "content": "", "tool_calls": [{"name": "f", "args": {}, "id": "c1"}]}],
        [{"type": "tool", "content": "x", "tool_call_id": "c1"}],
    ),
    **{
        name: (f.call("c1"), f.results("c1"))
        for name, f in (("converse", Converse()), ("gemini", Gemini(False, True)))
    },
    "claude-code": (ClaudeCode().call("c1"), ClaudeCode().results("c1")),
}


@pytest.mark.parametrize("called", list(_ANSWERED))
def test_a_call_answered_in_another_dialect_is_not_answered(called: str) -> None:
    """Each API takes only its own results: one of another dialect is an orphan (naming both),
    the call stays open, and the repair closes it in its own dialect."""
    calls, results = _ANSWERED[called]
    assert kinds([*calls, *results]) == [], called
    for answered, (_, others) in _ANSWERED.items():
        if answered == called:
            continue
        history = [*calls, *others]
        problems = validate_history(history)
        orphan = [p for p in problems if p.kind == "orphan-result"]
        assert [p.call_id for p in orphan] == ["c1"], (called, answered)
        assert f"is {answered}'s, but its call" in orphan[0].detail, orphan[0].detail
        assert [p.kind for p in problems].count("unclosed-call") == 1, (called, answered)
        assert close_dangling_tool_calls(history)[1] == 1


@pytest.mark.parametrize(
    "odd",
    [
        {"role": "assistant", "content": [{"type": "frobnicate"}]},
        {"role": "user", "content": [{"type": "text", "text": "q"}, "a bare string"]},
        {"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]},
        {"role": "assistant", "content": [_BLOCK_RESULT]},
        {"role": "system", "content": [_BLOCK_RESULT]},
        {"role": "assistant", "content": [{"type": "tool_use", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": ["c1"]}]},
        {"role": "model", "parts": "hello"},
        {"role": "user", "parts": {"text": "q"}},
    ],
    ids=lambda odd: str(odd)[:60],
)
def test_a_message_no_api_takes_is_unrecognised_in_every_role_dialect(odd: Any) -> None:
    """Anthropic blocks of an unknown type, a tool block in the wrong role or without an id,
    Gemini parts that are not a list: unrecognised, as the claude-code dialect reads the same
    blocks, never a chat message that passes as fine."""
    history = [{"role": "user", "content": "q"}, odd, {"role": "user", "content": "next"}]
    assert detect(odd) is None
    assert [(p.kind, p.index) for p in validate_history(history)] == [("unrecognised", 1)]
    assert count_turns(history) is None
    if odd["role"] in ("user", "assistant") and "content" in odd:  # in a Claude Code entry too
        entry = {"type": odd["role"], "uuid": "u1", "message": odd}
        assert detect(entry) is None


def test_an_id_less_chat_call_is_not_checked_and_says_so() -> None:
    """A call without an id can be neither answered nor checked: a note, not a silent ok."""
    call = {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f"}}]}
    assert kinds([{"role": "user", "content": "q"}, call]) == [("unrecognised", 1, None)]


def test_the_content_parts_of_chat_and_responses_messages_are_known() -> None:
    """Chat-completions' and Responses' content parts are chat messages, not unrecognised."""
    parts = ["text", "image_url", "input_audio", "file", "input_text", "input_image"]
    parts += ["input_file", "output_text", "refusal"]
    for part in parts:
        message = {"role": "user", "content": [{"type": part}]}
        assert getattr(detect(message), "name", None) == "chat", part


# -- ADK branches: a ParallelAgent's sub-agents interleave ---------------------------------


def _parallel_agent_events() -> list[Any]:
    """The events of a real ADK ParallelAgent run: two sub-agents, each calling a slow tool,
    on branches ``par.a`` and ``par.b`` (a scripted model; no network)."""
    pytest.importorskip("google.adk")
    import asyncio
    import itertools
    import warnings
    from collections.abc import AsyncGenerator

    from google.adk.agents import BaseAgent, LlmAgent, ParallelAgent
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_request import LlmRequest
    from google.adk.models.llm_response import LlmResponse
    from google.adk.runners import InMemoryRunner
    from google.genai import types

    class Scripted(BaseLlm):
        model: str = "scripted"

        async def generate_content_async(
            self, llm_request: LlmRequest, stream: bool = False
        ) -> AsyncGenerator[LlmResponse, None]:
            last = (llm_request.contents[-1].parts or [types.Part()])[0]
            part = (
                types.Part(text="done")
                if last.function_response
                else types.Part(function_call=types.FunctionCall(id=f"c{next(ids)}", name="slow"))
            )
            yield LlmResponse(content=types.Content(role="model", parts=[part]))

    ids = itertools.count()

    async def slow() -> str:
        """A tool that takes a while: the other branch moves on meanwhile."""
        await asyncio.sleep(0.05)
        return "ok"

    async def run() -> list[Any]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # ParallelAgent: still shipped
            subs: list[BaseAgent] = [LlmAgent(name=n, model=Scripted(), tools=[slow]) for n in "ab"]
            runner = InMemoryRunner(ParallelAgent(name="par", sub_agents=subs), app_name="app")
        session = await runner.session_service.create_session(app_name="app", user_id="u")
        for text in ("one", "two"):
            message = types.Content(role="user", parts=[types.Part(text=text)])
            async for _ in runner.run_async(
                user_id="u", session_id=session.id, new_message=message
            ):
                pass
        done = await runner.session_service.get_session(
            app_name="app", user_id="u", session_id=session.id
        )
        assert done is not None
        return list(done.events)

    return asyncio.run(run())


def test_a_parallel_agents_interleaved_branches_are_sendable() -> None:
    """Branch ``b``'s events between a call of ``a`` and its response neither answer it nor end
    its window (ADK builds ``a``'s request without them); a dropped response is still found,
    and closed in its call's branch."""
    events = _parallel_agent_events()
    branches = [e.branch for e in events]
    calls = [i for i, e in enumerate(events) if e.get_function_calls()]
    assert any(branches[i + 1] != branches[i] for i in calls)  # the branches interleave
    for history in (events, [e.model_dump(mode="json", exclude_none=True) for e in events]):
        assert kinds(history) == [], history
        last = max(i for i, e in enumerate(events) if e.get_function_responses())
        dropped = history[:last] + history[last + 1 :]
        assert [k for k, *_ in kinds(dropped)] == ["unclosed-call"]
        repaired, count = close_dangling_tool_calls(dropped)
        assert count == 1 and kinds(repaired) == []
        added = [m for m in repaired if not any(m is d for d in dropped)]
        assert [getattr(m, "branch", None) or m.get("branch") for m in added] == [branches[last]]
