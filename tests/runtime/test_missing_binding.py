"""A name that is no binding, among many bindings, through the real `RuntimeService.Run` API: the
Python and TypeScript workers name the closest binding and list a bounded number of them, in
the same words (the corpus case `missing-binding-closest-name` covers a few bindings)."""

from __future__ import annotations

from typing import Any

from codemode_wire import jsonvalue
from tests.runtime.conftest import connected, grpc_settings, serving, start_message_in
from tests.runtime.test_language_corpus import LANGUAGES

NAMES = [f"tool_{n:03}" for n in range(500)] + ["list_file"]
LONG = "x" * 10_000

PROGRAMS = {
    "python": (
        "found = []\n"
        "for name in ('list_files', 'x' * 10_000):\n"
        "    try:\n"
        "        getattr(tools, name)\n"
        "    except AttributeError as e:\n"
        "        found.append(str(e))\n"
        "return found\n"
    ),
    "typescript": (
        "const found: string[] = [];\n"
        "for (const name of ['list_files', 'x'.repeat(10_000)]) {\n"
        "  try { tools[name]; } catch (e) { found.push((e as Error).message); }\n"
        "}\n"
        "return found;\n"
    ),
}


async def _messages(language: str) -> Any:
    async with serving(grpc_settings()) as running, connected(running) as stub:
        call = stub.Run()
        await call.write(start_message_in(language, PROGRAMS[language], *NAMES))
        terminal = None
        async for message in call:
            if message.WhichOneof("kind") == "terminal":
                terminal = message.terminal
                await call.done_writing()
    assert terminal is not None and terminal.WhichOneof("outcome") == "success", terminal
    return jsonvalue.loads(terminal.success.value_json)


LISTED = ", ".join(sorted(NAMES)[:20]) + " and 481 more"


async def test_the_message_is_bounded_and_the_same_in_every_language() -> None:
    seen = {}
    for param in LANGUAGES:
        language = param.values[0]
        if any(mark.name == "skip" for mark in param.marks):
            continue
        seen[language] = await _messages(str(language))
    assert "python" in seen
    for language, (close, long) in seen.items():
        assert close == (
            f"tools has no binding 'list_files' (did you mean 'list_file'?); bindings: {LISTED}"
        ), language
        assert long == f"tools has no binding '{LONG[:100]}…'; bindings: {LISTED}", language
    assert len({jsonvalue.dumps(found) for found in seen.values()}) == 1
