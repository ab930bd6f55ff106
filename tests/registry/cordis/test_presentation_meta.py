"""presentationMeta (reference §9.2, §9.6): `cordis_define` and `cordis_run` results carry their
ids as presentation metadata, and a dynamic tool's `presentation_meta(args, result)` reaches its
call's result; none of it is in what the model is shown. Real plugin hosts, gRPC API."""

from __future__ import annotations

import json

from tests.registry.cordis.real_stack import real_stack

ZONED = """\
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


async def test_define_run_and_dynamic_tools_carry_presentation_meta() -> None:
    async with real_stack() as h:
        agent = await h.agent("presenter")
        defined = await h.call(
            agent,
            "cordis_define",
            {
                "plugin": {"kind": "new", "idPrefix": "zone"},
                "name": "Zoned",
                "purpose": "Tell the time.",
                "code": {"host": ZONED},
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
        assert bad.error.message.startswith(
            'the presentation_meta of tool "bad_meta" must return a dict that must be lossless'
        )
