"""presentationMeta: `cordis_define` and `cordis_run` results carry their
ids as presentation metadata, and a dynamic tool's `presentation_meta(args, result)` reaches its
call's result; none of it is in what the model is shown. Real plugin hosts (both host languages),
gRPC API."""

from __future__ import annotations

import json

import pytest

from tests.registry.cordis.real_stack import LANGUAGES, real_stack

ZONED_PY = """\
def now(args):
    return {"time": "12:00"}

async def apply(ctx):
    harness.register_tool(harness.define_tool(
        name="zoned_now", description="The time.",
        parameters={"type": "object", "properties": {"zone": {"type": "string"}}},
        execute=now,
        presentation_meta=lambda args, result: {"zone": args.get("zone"), "at": result["time"]}))
    harness.register_tool(harness.define_tool(
        name="bad_meta", description="Lossy metadata.", execute=now,
        presentation_meta=lambda args, result: {"zones": {1, 2}}))
    harness.register_tool(harness.define_tool(name="plain", description="None.", execute=now))

return apply
"""

ZONED = {
    "python": ZONED_PY,
    "typescript": """\
const now = () => ({ time: "12:00" });

return async (ctx: unknown) => {
  harness.registerTool(harness.defineTool({
    name: "zoned_now", description: "The time.",
    parameters: { type: "object", properties: { zone: { type: "string" } } },
    execute: now,
    presentationMeta: (args: { zone?: string }, result: { time: string }) =>
      ({ zone: args.zone ?? null, at: result.time }),
  }));
  harness.registerTool(harness.defineTool({
    name: "bad_meta", description: "Lossy metadata.", execute: now,
    presentationMeta: () => ({ zones: new Set([1, 2]) }),
  }));
  harness.registerTool(harness.defineTool({ name: "plain", description: "None.", execute: now }));
};
""",
}
BAD_META = {
    "python": 'the presentation_meta of tool "bad_meta" must return a dict that must be lossless',
    "typescript": (
        'the presentationMeta of tool "bad_meta" must return an object that must be lossless'
    ),
}


@pytest.mark.parametrize("language", LANGUAGES)
async def test_define_run_and_dynamic_tools_carry_presentation_meta(language: str) -> None:
    async with real_stack() as h:
        agent = await h.agent("presenter", language=language)
        defined = await h.call(
            agent,
            "cordis_define",
            {
                "plugin": {"kind": "new", "idPrefix": "zone"},
                "name": "Zoned",
                "purpose": "Tell the time.",
                "code": {"host": ZONED[language]},
            },
            "d1",
        )
        assert json.loads(defined.presentation_meta_json) == {
            "pluginId": "zone-1",
            "packageId": "pkg-1",
        }
        ran = await h.call(
            agent, "cordis_run", {"pluginId": "zone-1", "packageId": "pkg-1", "mode": "run"}, "r1"
        )
        assert json.loads(ran.presentation_meta_json) == {
            "pluginId": "zone-1",
            "packageId": "pkg-1",
            "pluginRunId": "run-1",
        }
        called = await h.call(agent, "zoned_now", {"zone": "cet"}, "z1")
        assert not called.is_error
        assert json.loads(called.value_json) == {"time": "12:00"}
        assert json.loads(called.presentation_meta_json) == {"zone": "cet", "at": "12:00"}
        assert "cet" not in called.content[0].text.text  # the model sees the value only
        plain = await h.call(agent, "plain", {}, "p1")
        assert not plain.is_error and not plain.HasField("presentation_meta_json")
        bad = await h.call(agent, "bad_meta", {}, "b1")
        assert bad.is_error
        assert bad.error.message.startswith(BAD_META[language])
