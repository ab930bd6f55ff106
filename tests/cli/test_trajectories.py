"""`codemode history export` and `codemode replay`, on a real trajectory of a real run: a
`codemode up` stack with the demo tool provider runs a program, its call is exported (records
from the registry, spans from the services' trace file) and replayed with no provider, as it
was (no divergence) and altered (the first divergent call reported)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from codemode_cli.exit_codes import ExitCode
from codemode_cli.trajectory import loads
from tests.cli._processes import CLI, cli, service_env, spawn, stop

PROGRAM = """\
import asyncio

files = await tools.list_files({})
texts = await asyncio.gather(*(tools.read_file({"path": p}) for p in files))
try:
    await tools.read_file({"path": "missing.txt"})
except ToolCallError as e:
    print(f"expected: {e}")
return {"files": len(texts), "first": texts[0]["text"]}
"""

TS_PROGRAM = """\
const files: string[] = await tools.list_files({});
const texts = await Promise.all(files.map((path) => tools.read_file({ path })));
return { files: texts.length, first: texts[0].text };
"""


@dataclass
class Recorded:
    registry: str
    env: dict[str, str]
    tmp: Path
    jsonl: Path
    otlp: Path

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return cli(*args, env=self.env, cwd=self.tmp, timeout=120)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    tmp = tmp_path_factory.mktemp("trajectory")
    env = service_env(tmp)
    argv = [*CLI, "up", "--registry-listen", "127.0.0.1:0", "--runtime-listen", "127.0.0.1:0"]
    up, lines = spawn(argv, env, tmp, tmp / "up.err")
    try:
        lines.expect(lambda line: line.startswith("connect:"), timeout=90)
        registry = next(
            line.removeprefix("registry listening on ")
            for line in lines.seen
            if line.startswith("registry listening on ")
        )
        provider, provider_lines = spawn(
            [sys.executable, "-m", "codemode_client.demo_tools", registry],
            env,
            tmp,
            tmp / "provider.err",
        )
        try:
            provider_lines.expect(lambda line: line == "ready")
            (tmp / "program.py").write_text(PROGRAM)
            ran = cli(
                "run", "program.py", "--agent", "recorder", "--create-agent",
                "--call-id", "rec-1", "--registry", registry, env=env, cwd=tmp,
            )  # fmt: skip
            assert ran.returncode == 0, ran.stderr
            (tmp / "program.ts").write_text(TS_PROGRAM)
            ts = cli(
                "run", "program.ts", "--agent", "recorder-ts", "--create-agent",
                "--call-id", "rec-ts", "--registry", registry, env=env, cwd=tmp,
            )  # fmt: skip
            assert ts.returncode == 0, ts.stderr
        finally:
            stop(provider)
        here = Recorded(registry, env, tmp, tmp / "rec-1.jsonl", tmp / "rec-1.otlp.json")
        trace_file = str(tmp / "traces.jsonl")
        for fmt, out in (("jsonl", here.jsonl), ("otlp-json", here.otlp)):
            exported = here.cli(
                "history", "export", "rec-1", "--format", fmt, "--out", str(out),
                "--registry", registry, "--trace-file", trace_file,
            )  # fmt: skip
            assert exported.returncode == 0, exported.stderr
        yield here
    finally:
        stop(up)


def test_export_writes_the_call_its_nested_calls_and_their_spans(recorded: Recorded) -> None:
    lines = [json.loads(line) for line in recorded.jsonl.read_text().splitlines()]
    header = lines[0]
    assert header == {
        "type": "trajectory",
        "version": 1,
        "call_id": "rec-1",
        "agent": "agents/recorder",
        "language": "python",
    }
    records = [line for line in lines if line["type"] == "record"]
    kinds = [r["kind"] for r in records]
    assert kinds[0] == "tool/call" and kinds[-1] == "tool/result"
    assert kinds.count("tool/code-dispatch-start") == kinds.count("tool/code-dispatch") == 5
    assert {r["parent_call_id"] for r in records[1:-1]} == {"rec-1"}
    failed = next(r for r in records if r["kind"] == "tool/code-dispatch" and r["is_error"])
    assert failed["arguments"] == {"path": "missing.txt"} and failed["error_code"] == "ENOENT"
    spans = [line for line in lines if line["type"] == "span"]
    names = [s["name"] for s in spans]
    assert names.count("execute_tool run_code") == 1 and names.count("execute_tool read_file") == 4
    assert len({s["trace_id"] for s in spans}) == 1  # one trace, the call's


def test_export_as_otlp_json_holds_the_spans_and_the_records(recorded: Recorded) -> None:
    traces, logs = (json.loads(line) for line in recorded.otlp.read_text().splitlines())
    spans = [
        span
        for resource in traces["resourceSpans"]
        for scope in resource["scopeSpans"]
        for span in scope["spans"]
    ]
    root = next(s for s in spans if s["name"] == "execute_tool run_code")
    assert root.get("parentSpanId") not in {s["spanId"] for s in spans}  # the tree's root
    assert len(root["traceId"]) == 32 and len(root["spanId"]) == 16
    assert int(root["endTimeUnixNano"]) >= int(root["startTimeUnixNano"]) > 0
    children = [s for s in spans if s.get("parentSpanId") == root["spanId"]]
    assert children, spans
    services = {
        kv["value"]["stringValue"]
        for resource in traces["resourceSpans"]
        for kv in resource["resource"]["attributes"]
        if kv["key"] == "service.name"
    }
    assert {"codemode-registry", "codemode-runtime"} <= services
    (resource_logs,) = logs["resourceLogs"]
    records = resource_logs["scopeLogs"][0]["logRecords"]
    assert len(records) == 12 and all(r["traceId"] == root["traceId"] for r in records)
    # both encodings read back to the same trajectory
    from_otlp, from_jsonl = loads(recorded.otlp.read_text()), loads(recorded.jsonl.read_text())
    assert from_otlp.records == from_jsonl.records
    assert from_otlp.nested_calls() == from_jsonl.nested_calls()


def test_export_of_an_unknown_call_exits_not_found(recorded: Recorded) -> None:
    done = recorded.cli("history", "export", "no-such", "--registry", recorded.registry)
    assert done.returncode == ExitCode.NOT_FOUND and done.stdout == ""
    # `codemode history`'s own options, given before `export`, count too
    before = recorded.cli("history", "--registry", recorded.registry, "export", "no-such")
    assert before.returncode == ExitCode.NOT_FOUND, before.stderr
    assert before.stderr.strip() == "codemode history export: no records of call no-such"


@pytest.mark.parametrize("fmt", ["jsonl", "otlp-json"])
def test_replay_of_the_unchanged_program_reports_no_divergence(
    recorded: Recorded, fmt: str
) -> None:
    path = recorded.jsonl if fmt == "jsonl" else recorded.otlp
    # the stack's provider is gone: every answer comes from the recording
    done = recorded.cli("replay", str(path), "--registry", recorded.registry)
    assert done.returncode == ExitCode.OK, done.stderr
    assert done.stdout.strip() == "replayed 5 calls, no divergence (the result is ok)"


def test_a_typescript_program_replays_in_typescript(recorded: Recorded) -> None:
    path = recorded.tmp / "rec-ts.jsonl"
    exported = recorded.cli(
        "history", "export", "rec-ts", "--out", str(path), "--registry", recorded.registry
    )
    assert exported.returncode == 0, exported.stderr
    assert loads(path.read_text()).language == "typescript"
    done = recorded.cli("replay", str(path), "--registry", recorded.registry)
    assert done.returncode == ExitCode.OK, done.stderr
    assert done.stdout.strip() == "replayed 4 calls, no divergence (the result is ok)"


def _altered(recorded: Recorded, old: str, new: str) -> Path:
    lines = [json.loads(line) for line in recorded.jsonl.read_text().splitlines()]
    for line in lines:
        if line.get("kind") == "tool/call":
            code = line["arguments"]["code"]
            assert old in code
            line["arguments"]["code"] = code.replace(old, new)
    path = recorded.tmp / f"altered-{abs(hash(new))}.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_replay_of_an_altered_program_reports_the_first_divergent_call(
    recorded: Recorded,
) -> None:
    """Its own services (no --registry): a runtime and a registry started by the replay."""
    path = _altered(recorded, '"missing.txt"', '"absent.txt"')
    done = recorded.cli("replay", str(path))
    assert done.returncode == ExitCode.DIVERGED, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        "codemode replay: divergence at call 5: other arguments",
        '  expected: read_file {"path": "missing.txt"}',
        '  actual:   read_file {"path": "absent.txt"}',
    ]


def test_replay_of_a_program_that_reads_fewer_files_reports_where_it_parts(
    recorded: Recorded,
) -> None:
    path = _altered(recorded, "for p in files)", "for p in files[:1])")
    done = recorded.cli("replay", str(path), "--registry", recorded.registry)
    assert done.returncode == ExitCode.DIVERGED, done.stdout + done.stderr
    # call 3 is now the missing.txt read where the recording read the second file
    assert done.stderr.splitlines()[0] == "codemode replay: divergence at call 3: other arguments"
    assert '"path": "missing.txt"' in done.stderr.splitlines()[2]


def test_replay_of_a_program_that_stops_early_reports_the_call_it_no_longer_makes(
    recorded: Recorded,
) -> None:
    path = _altered(recorded, 'await tools.read_file({"path": "missing.txt"})', "pass")
    done = recorded.cli("replay", str(path), "--registry", recorded.registry)
    assert done.returncode == ExitCode.DIVERGED, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        "codemode replay: divergence at call 5: the program did not make it",
        '  expected: read_file {"path": "missing.txt"}',
        "  actual:   no call (the program made no more calls)",
    ]


def test_replay_of_a_file_that_is_not_a_trajectory_is_a_usage_error(recorded: Recorded) -> None:
    (recorded.tmp / "junk.jsonl").write_text('{"hello": 1}\n')
    done = recorded.cli("replay", str(recorded.tmp / "junk.jsonl"))
    assert done.returncode == ExitCode.USAGE
    assert "not a trajectory" in done.stderr
