"""The Claude Code CLI, through the Claude Agent SDK, against a scripted Messages API.

``MessagesServer`` answers ``POST /v1/messages`` on 127.0.0.1 as the
Messages API streams (server-sent events): a prompt gets a ``Bash``
``tool_use`` that runs the prompt's command, a tool result gets an
``end_turn`` answer quoting it.  Run as a script, this module is one SDK
session (``query`` with a ``CheckpointSessionStore`` on a ``JournalStore``)
in an empty ``CLAUDE_CONFIG_DIR``: ``python -m tests.children.claude_child
ROOT BASE_URL BACKEND PROMPT [RESUME_ID]``; ``... delete ROOT SESSION_ID BACKEND``
deletes one through the SDK's ``delete_session_via_store``.

A server's many sessions, without the CLI (``test_claude_agent_sdk.py``):
``... many ROOT N BACKEND``: under ``tests._support.limit_descriptors()``, sessions ``s<i>`` of
project ``proj`` each get one entry (uuid ``u<i>``), 64 at a time; closed, the
registry's statistics printed as JSON.  ``... reopen ROOT BACKEND``: session
``s0`` gets entry ``first``, is closed for idleness (``idle``), waits for a
line on stdin (another process appends meanwhile), gets entry ``mine``; prints
the uuids it resumed from.
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import claude_agent_sdk

MODEL = "claude-sonnet-4-5"
CLI = str(Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude")  # the SDK's own


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message["content"]
    return content if isinstance(content, list) else [{"type": "text", "text": content}]


def _reply(body: dict[str, Any], n: int) -> tuple[list[dict[str, Any]], str]:
    """The content blocks and stop reason the script answers ``body`` with.

    A prompt ``... RUN: command`` not yet answered with a call gets a Bash call
    running it; else the answer quotes the result of the latest call.  (The
    CLI merges a turn's prompt into the message of the previous tool results,
    so the order of blocks says nothing.)
    """
    prompts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: dict[str, Any] = {}
    for message in body["messages"]:
        for block in _blocks(message):
            text = block.get("text", "")
            if message["role"] == "user" and "RUN:" in text and text not in prompts:
                prompts.append(text)
            elif block.get("type") == "tool_use":
                calls.append(block)
            elif block.get("type") == "tool_result":
                results[block["tool_use_id"]] = block["content"]
    tools = {t.get("name") for t in body.get("tools") or ()}
    if len(calls) < len(prompts) and "Bash" in tools:
        command = prompts[-1].split("RUN:", 1)[1].strip()
        call = {"type": "tool_use", "id": f"toolu_{n:04d}", "name": "Bash"}
        return [{**call, "input": {"command": command}}], "tool_use"
    if calls and calls[-1]["id"] in results:
        out = results[calls[-1]["id"]]
        text = out if isinstance(out, str) else " ".join(c.get("text", "") for c in out)
        return [{"type": "text", "text": f"done: {text.strip()}"}], "end_turn"
    return [{"type": "text", "text": "ok"}], "end_turn"


class MessagesServer:
    """A scripted Messages API on 127.0.0.1; ``requests`` keeps every request body."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                self.send_response(200)
                self.end_headers()

            def do_GET(self) -> None:
                self.send_response(404)
                self.end_headers()

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                if not self.path.startswith("/v1/messages") or "count_tokens" in self.path:
                    self._json({"input_tokens": 10})
                    return
                server.requests.append(body)
                blocks, stop = _reply(body, len(server.requests))
                if body.get("stream"):
                    self._stream(blocks, stop)
                else:
                    self._json(_message(blocks, stop))

            def _json(self, data: dict[str, Any]) -> None:
                raw = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _stream(self, blocks: list[dict[str, Any]], stop: str) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.end_headers()
                self.wfile.write(
                    _sse("message_start", {"type": "message_start", "message": _message([], None)})
                )
                for i, block in enumerate(blocks):
                    start = (
                        {**block, "input": {}}
                        if block["type"] == "tool_use"
                        else {**block, "text": ""}
                    )
                    self.wfile.write(
                        _sse(
                            "content_block_start",
                            {"type": "content_block_start", "index": i, "content_block": start},
                        )
                    )
                    if block["type"] == "tool_use":
                        delta = {
                            "type": "input_json_delta",
                            "partial_json": json.dumps(block["input"]),
                        }
                    else:
                        delta = {"type": "text_delta", "text": block["text"]}
                    self.wfile.write(
                        _sse(
                            "content_block_delta",
                            {"type": "content_block_delta", "index": i, "delta": delta},
                        )
                    )
                    self.wfile.write(
                        _sse("content_block_stop", {"type": "content_block_stop", "index": i})
                    )
                done = {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": 5},
                }
                self.wfile.write(_sse("message_delta", done))
                self.wfile.write(_sse("message_stop", {"type": "message_stop"}))
                self.wfile.flush()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> MessagesServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def _message(blocks: list[dict[str, Any]], stop: str | None) -> dict[str, Any]:
    return {
        "id": "msg_scripted",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": blocks,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }


def cli_env(base_url: str, config_dir: str) -> dict[str, str]:
    """The CLI's environment: the scripted API, any key, an empty config dir, nothing sent home."""
    return {
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "sk-ant-test",
        "CLAUDE_CONFIG_DIR": config_dir,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
    }


async def run_session(root: str, base_url: str, prompt: str, resume: str | None) -> None:
    """One query through the SDK with the transcript mirrored to ``root``, in an empty config dir.

    Prints ``session <id>`` once the CLI is up, ``mirror-error <text>`` for
    each batch the store refused, ``result <id>`` at the end.
    """
    from claude_agent_sdk import (
        ClaudeAgentOptions,
        MirrorErrorMessage,
        ResultMessage,
        SystemMessage,
        query,
    )

    from checkpointer import JournalStore
    from checkpointer.claude_agent_sdk import CheckpointSessionStore

    config_dir = tempfile.mkdtemp(prefix="claude-config-")  # empty: the store is all there is
    async with CheckpointSessionStore(JournalStore(root)) as sessions:
        options = ClaudeAgentOptions(
            model=MODEL,
            cwd=root,
            allowed_tools=["Bash"],
            session_store=sessions,
            session_store_flush="eager",
            resume=resume,
            env=cli_env(base_url, config_dir),
            cli_path=CLI,
            stderr=lambda line: print("cli:", line, file=sys.stderr, flush=True),
        )
        async for message in query(prompt=prompt, options=options):
            if isinstance(message, MirrorErrorMessage):
                print("mirror-error", message.error.replace("\n", " "), flush=True)
            elif isinstance(message, SystemMessage) and message.subtype == "init":
                print("session", message.data["session_id"], flush=True)
            elif isinstance(message, ResultMessage):
                print("result", message.session_id, flush=True)


async def delete(root: str, session_id: str) -> None:
    """Delete it with the SDK's ``delete_session_via_store``: ``deleted`` or ``refused <why>``."""
    from claude_agent_sdk import delete_session_via_store

    from checkpointer import JournalStore
    from checkpointer.claude_agent_sdk import CheckpointFailed, CheckpointSessionStore

    async with CheckpointSessionStore(JournalStore(root)) as sessions:
        try:
            await delete_session_via_store(sessions, session_id, directory=root)
        except CheckpointFailed as exc:
            print("refused", exc.result.reason, flush=True)
        else:
            print("deleted", flush=True)


def entry(uuid: str) -> Any:
    """A user entry as the CLI writes it."""
    message = {"role": "user", "content": f"prompt {uuid}"}
    return {"type": "user", "uuid": uuid, "parentUuid": None, "message": message}


async def many(root: str, n: int) -> None:
    import anyio
    import msgspec

    from checkpointer import JournalStore
    from checkpointer.claude_agent_sdk import CheckpointSessionStore
    from tests._support import MAX_OPEN, limit_descriptors

    limit_descriptors()
    keys = iter(range(n))

    async def requests() -> None:  # a server's: many sessions at once
        for i in keys:
            await sessions.append({"project_key": "proj", "session_id": f"s{i}"}, [entry(f"u{i}")])

    async with CheckpointSessionStore(JournalStore(root), max_open=MAX_OPEN) as sessions:
        async with anyio.create_task_group() as tg:
            for _ in range(64):
                tg.start_soon(requests)
        stats = sessions._registry.statistics()
    print(json.dumps(msgspec.to_builtins(stats)), flush=True)


async def reopen(root: str) -> None:
    import anyio
    import anyio.to_thread

    from checkpointer import JournalStore
    from checkpointer.claude_agent_sdk import CheckpointSessionStore

    key: Any = {"project_key": "proj", "session_id": "s0"}
    async with CheckpointSessionStore(JournalStore(root), idle_timeout=0.05) as sessions:
        await sessions.append(key, [entry("first")])
        while sessions._registry.statistics().closed_idle == 0:  # noqa: ASYNC110 -- a counter
            await anyio.sleep(0.01)
        print("idle", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        await sessions.append(key, [entry("mine")])
        print("resumed", *[e["uuid"] for e in await sessions.load(key) or []], flush=True)


if __name__ == "__main__":
    import anyio

    if sys.argv[1] == "many":
        anyio.run(many, sys.argv[2], int(sys.argv[3]), backend=sys.argv[4])
    elif sys.argv[1] == "reopen":
        anyio.run(reopen, sys.argv[2], backend=sys.argv[3])
    elif sys.argv[1] == "delete":
        root, session_id, backend = sys.argv[2:5]
        anyio.run(delete, root, session_id, backend=backend)
    else:
        root, base_url, backend, prompt = sys.argv[1:5]
        resume = sys.argv[5] if len(sys.argv) > 5 else None
        anyio.run(run_session, root, base_url, prompt, resume, backend=backend)
