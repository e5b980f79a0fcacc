"""Builders of agent histories in the frameworks' dialects, as objects and as dicts.

Each form builds the same conversation pieces (a user's text, an assistant
message calling tools, the results of those calls, an assistant's answer)
in one dialect and one representation: the frameworks' own objects, or the
dicts their JSON form or dumps give.  ``tests/transcripts.py`` has the chat
and Anthropic-style forms; these are the Responses, pydantic-ai and
LangChain ones.
"""

from __future__ import annotations

from typing import Any


class Responses:
    """OpenAI Responses / Agents SDK items: role messages, ``function_call`` items and outputs."""

    dialect = "responses"
    name = "responses-dict"

    def user(self, text: str) -> list[Any]:
        return [{"role": "user", "content": text}]

    def answer(self, text: str) -> list[Any]:
        content = [{"type": "output_text", "text": text, "annotations": []}]
        return [{"type": "message", "role": "assistant", "content": content, "id": "m"}]

    def call(self, *ids: str) -> list[Any]:
        return [
            {"type": "function_call", "call_id": i, "name": "lookup", "arguments": '{"q": 2}'}
            for i in ids
        ]

    def results(self, *ids: str) -> list[Any]:
        return [{"type": "function_call_output", "call_id": i, "output": f"r {i}"} for i in ids]


class PydanticAI:
    """pydantic-ai ``ModelRequest`` / ``ModelResponse`` objects, or their JSON form."""

    dialect = "pydantic-ai"

    def __init__(self, json: bool) -> None:
        self.json = json
        self.name = "pydantic-ai-json" if json else "pydantic-ai-objects"

    def _form(self, messages: list[Any]) -> list[Any]:
        if not self.json:
            return messages
        from pydantic_ai.messages import ModelMessagesTypeAdapter

        return list(ModelMessagesTypeAdapter.dump_python(messages, mode="json"))

    def user(self, text: str) -> list[Any]:
        from pydantic_ai.messages import ModelRequest, UserPromptPart

        return self._form([ModelRequest(parts=[UserPromptPart(text)])])

    def answer(self, text: str) -> list[Any]:
        from pydantic_ai.messages import ModelResponse, TextPart

        return self._form([ModelResponse(parts=[TextPart(text)])])

    def call(self, *ids: str) -> list[Any]:
        from pydantic_ai.messages import ModelResponse, ToolCallPart

        parts = [ToolCallPart("lookup", {"q": 2}, tool_call_id=i) for i in ids]
        return self._form([ModelResponse(parts=list(parts))])

    def results(self, *ids: str) -> list[Any]:
        from pydantic_ai.messages import ModelRequest, ToolReturnPart

        parts = [ToolReturnPart("lookup", f"r {i}", tool_call_id=i) for i in ids]
        return self._form([ModelRequest(parts=list(parts))])


class LangChain:
    """LangChain messages: objects, ``model_dump()`` dicts, or ``messages_to_dict`` dicts."""

    dialect = "langchain"

    def __init__(self, form: str) -> None:
        self.form = form  # "objects", "dump" or "dict"
        self.name = f"langchain-{form}"

    def _form(self, messages: list[Any]) -> list[Any]:
        if self.form == "dump":
            return [m.model_dump() for m in messages]
        if self.form == "dict":
            from langchain_core.messages import messages_to_dict

            return list(messages_to_dict(messages))
        return messages

    def user(self, text: str) -> list[Any]:
        from langchain_core.messages import HumanMessage

        return self._form([HumanMessage(text)])

    def answer(self, text: str) -> list[Any]:
        from langchain_core.messages import AIMessage

        return self._form([AIMessage(text)])

    def call(self, *ids: str) -> list[Any]:
        from langchain_core.messages import AIMessage

        calls: list[Any] = [{"name": "lookup", "args": {"q": 2}, "id": i} for i in ids]
        return self._form([AIMessage("", tool_calls=calls)])

    def results(self, *ids: str) -> list[Any]:
        from langchain_core.messages import ToolMessage

        return self._form([ToolMessage(f"r {i}", tool_call_id=i, name="lookup") for i in ids])


Form = Responses | PydanticAI | LangChain
FORMS: list[Form] = [
    Responses(),
    PydanticAI(json=False),
    PydanticAI(json=True),
    LangChain("objects"),
    LangChain("dump"),
    LangChain("dict"),
]
