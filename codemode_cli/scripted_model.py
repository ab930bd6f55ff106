"""A scripted model on loopback that speaks the vendors' HTTP APIs: OpenAI Responses
(`POST /v1/responses`), OpenAI Chat Completions (`POST /v1/chat/completions`) and Anthropic
Messages (`POST /v1/messages`), JSON only (no streaming). No key, no network: point the real SDK
clients at it (`AsyncOpenAI(base_url=f"{url}/v1", api_key="scripted")`,
`AsyncAnthropic(base_url=url, api_key="scripted")`).

A script maps model names (the request's `model`) to turns:

    {"count-todos": [
        {"call": {"name": "run_code", "arguments": {"code": "...", "description": "..."}}},
        {"say": "The workspace has {result}"}
    ]}

- `call`: one tool call or a list of them; `arguments` is an object, `arguments_text` raw text
  sent as it is (how a test sends malformed arguments).
- `say`: the answer text; `{result}` stands for the text of the last tool result the request
  carries, which is how the scripted model shows it read the results.

The server keeps no conversation: the turn it answers is the number of model turns already in
the request's history (assistant messages; in Responses, runs of model output items), so any
number of conversations may share it. Every request body is recorded (`GET /requests` lists
them, `ScriptedModel.requests` in process) for tests to check what the model was sent.

    python -m codemode_cli.scripted_model --script script.json --listen 127.0.0.1:0
    # prints "scripted model listening on port N", serves until SIGINT/SIGTERM
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from codemode_cli.arguments import host_port

Json = dict[str, Any]
Script = Mapping[str, Sequence[Mapping[str, Any]]]
MAX_BODY_BYTES = 64 * 1024 * 1024
_MODEL_OUTPUT_ITEMS = {"function_call", "reasoning"}


class ScriptError(Exception):
    """A request the script cannot answer (HTTP 400/404 with the vendor's error shape)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def check_script(script: object) -> Script:
    """The script, or ValueError naming what is wrong with it."""
    if not isinstance(script, dict):
        raise ValueError("a script is an object: model name -> list of turns")
    for model, turns in script.items():
        if not isinstance(turns, list) or not turns:
            raise ValueError(f"script {model!r}: expected a non-empty list of turns")
        for n, turn in enumerate(turns, 1):
            if not isinstance(turn, dict) or len(turn.keys() & {"call", "say"}) != 1:
                raise ValueError(
                    f"script {model!r} turn {n}: expected {{'call': ...}} or {{'say': ...}}"
                )
            for call in _calls_of_turn(turn):
                if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                    raise ValueError(f"script {model!r} turn {n}: a call needs a 'name'")
    return script


def _calls_of_turn(turn: Mapping[str, Any]) -> list[Any]:
    calls = turn.get("call", [])
    return list(calls) if isinstance(calls, list) else [calls]


def _arguments_text(call: Mapping[str, Any]) -> str:
    if "arguments_text" in call:
        return str(call["arguments_text"])
    return json.dumps(call.get("arguments", {}))


def _text_of(content: Any) -> str:
    """The text of a tool result's content in any of the three shapes."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


# -- reading a request's history, per API --------------------------------------------------------


def _responses_history(body: Json) -> tuple[int, str]:
    items = body.get("input")
    if not isinstance(items, list):
        return 0, ""
    turns, in_output, result = 0, False, ""
    for item in items:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        is_output = kind in _MODEL_OUTPUT_ITEMS or (
            kind == "message" and item.get("role") == "assistant"
        )
        if is_output and not in_output:
            turns += 1
        in_output = is_output
        if kind == "function_call_output":
            result = _text_of(item.get("output"))
    return turns, result


def _chat_history(body: Json) -> tuple[int, str]:
    messages = [m for m in body.get("messages") or () if isinstance(m, dict)]
    result = ""
    for message in messages:
        if message.get("role") == "tool":
            result = _text_of(message.get("content"))
    return sum(m.get("role") == "assistant" for m in messages), result


def _messages_history(body: Json) -> tuple[int, str]:
    messages = [m for m in body.get("messages") or () if isinstance(m, dict)]
    result = ""
    for message in messages:
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, list):
            for block in content:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    result = _text_of(block.get("content"))
    return sum(m.get("role") == "assistant" for m in messages), result


# -- answering, per API ----------------------------------------------------------------------------


def _call_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:16]}"


def _responses_reply(model: str, turn: Mapping[str, Any], result: str) -> Json:
    output: list[Json] = []
    for call in _calls_of_turn(turn):
        output.append(
            {
                "type": "function_call",
                "id": _call_id("fc_"),
                "call_id": _call_id("call_"),
                "name": call["name"],
                "arguments": _arguments_text(call),
                "status": "completed",
            }
        )
    if "say" in turn:
        text = str(turn["say"]).replace("{result}", result)
        output.append(
            {
                "type": "message",
                "id": _call_id("msg_"),
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    return {
        "id": _call_id("resp_"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "usage": {
            "input_tokens": 0,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 0,
        },
    }


def _chat_reply(model: str, turn: Mapping[str, Any], result: str) -> Json:
    calls = [
        {
            "id": _call_id("call_"),
            "type": "function",
            "function": {"name": call["name"], "arguments": _arguments_text(call)},
        }
        for call in _calls_of_turn(turn)
    ]
    message: Json = {"role": "assistant", "content": None, "refusal": None}
    if calls:
        message["tool_calls"] = calls
    if "say" in turn:
        message["content"] = str(turn["say"]).replace("{result}", result)
    return {
        "id": _call_id("chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls" if calls else "stop",
                "logprobs": None,
                "message": message,
            }
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def _messages_reply(model: str, turn: Mapping[str, Any], result: str) -> Json:
    content: list[Json] = []
    for call in _calls_of_turn(turn):
        if "arguments_text" in call:
            arguments: Any = call["arguments_text"]  # not an object: what a broken model sends
        else:
            arguments = call.get("arguments", {})
        content.append(
            {"type": "tool_use", "id": _call_id("toolu_"), "name": call["name"], "input": arguments}
        )
    if "say" in turn:
        content.append({"type": "text", "text": str(turn["say"]).replace("{result}", result)})
    return {
        "id": _call_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if "call" in turn else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }


Api = tuple[
    str,
    Callable[[Json], tuple[int, str]],
    Callable[[str, Mapping[str, Any], str], Json],
]
APIS: dict[str, Api] = {
    "/v1/responses": ("responses", _responses_history, _responses_reply),
    "/v1/chat/completions": ("chat", _chat_history, _chat_reply),
    "/v1/messages": ("messages", _messages_history, _messages_reply),
}


def answer(script: Script, path: str, body: Json) -> tuple[str, Json]:
    """(api, response body) for one request; ScriptError for what the script cannot answer."""
    if path not in APIS:
        raise ScriptError(404, f"no such API: {path}")
    api, history, reply = APIS[path]
    if body.get("stream"):
        raise ScriptError(400, "the scripted model does not stream")
    model = body.get("model")
    turns = script.get(model) if isinstance(model, str) else None
    if turns is None:
        raise ScriptError(404, f"no script for model {model!r} (scripts: {sorted(script)})")
    done, result = history(body)
    if done >= len(turns):
        raise ScriptError(400, f"script {model!r} has {len(turns)} turns; this is turn {done + 1}")
    return api, reply(str(model), turns[done], result)


def _error_body(api: str, status: int, message: str) -> Json:
    if api == "messages":
        kind = "not_found_error" if status == 404 else "invalid_request_error"
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": "invalid_request_error", "code": None}}


class ScriptedModel:
    """The server on a thread of this process: `with ScriptedModel(script) as model: model.url`."""

    def __init__(self, script: object, host: str = "127.0.0.1", port: int = 0) -> None:
        self.script = check_script(script)
        self.requests: list[Json] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), _handler(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def record(self, api: str, body: Json) -> None:
        with self._lock:
            self.requests.append({"api": api, "body": body})

    def recorded(self, api: str | None = None) -> list[Json]:
        """The request bodies received so far (of one API)."""
        with self._lock:
            return [r["body"] for r in self.requests if api is None or r["api"] == api]

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def start(self) -> ScriptedModel:
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> ScriptedModel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _handler(model: ScriptedModel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/requests":
                with model._lock:
                    self._send(200, list(model.requests))
            else:
                self._send(404, {"error": {"message": f"no such path: {self.path}"}})

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0].rstrip("/")
            api = APIS.get(path, ("unknown",))[0]
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 < length <= MAX_BODY_BYTES:
                self.close_connection = True
                self._send(400, _error_body(api, 400, "expected a JSON body"))
                return
            try:
                body = json.loads(self.rfile.read(length))
                if not isinstance(body, dict):
                    raise ValueError("not an object")
            except ValueError as exc:
                self._send(400, _error_body(api, 400, f"the body is not a JSON object: {exc}"))
                return
            model.record(api, body)
            try:
                _, reply = answer(model.script, path, body)
            except ScriptError as exc:
                self._send(exc.status, _error_body(api, exc.status, str(exc)))
                return
            self._send(200, reply)

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet: the requests are recorded

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m codemode_cli.scripted_model",
        description="Serve a scripted model on loopback (OpenAI Responses, Chat Completions, "
        "Anthropic Messages).",
    )
    parser.add_argument("--script", required=True, help="a JSON file: model name -> turns")
    parser.add_argument("--listen", type=host_port, default=("127.0.0.1", 0))
    args = parser.parse_args(argv)
    try:
        with open(args.script, encoding="utf-8") as handle:
            server = ScriptedModel(json.load(handle), *args.listen)
    except (OSError, ValueError) as exc:
        parser.error(f"cannot load {args.script}: {exc}")
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.stop).start())
    print(f"scripted model listening on port {server.port}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
