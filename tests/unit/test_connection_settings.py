"""Connection settings: the runtime's max connection age and ping policy, the registry's
keepalive on its runtime channel. Parsing and validation, then their effect on real
connections, observed from the HTTP/2 frames a TCP proxy sees passing between the two."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from registry_service.codemode.runtime_port import RunSpec, RunTerminal, RuntimeLost
from registry_service.config import ConfigError as RegistryConfigError
from registry_service.config import load_settings as load_registry
from registry_service.runtime_client import GrpcRuntime, channel_options
from runtime_service.config import ConfigError as RuntimeConfigError
from runtime_service.config import RuntimeSettings
from runtime_service.config import load_settings as load_runtime
from runtime_service.server import MIN_PING_INTERVAL_MS, server_options
from runtime_service.server import start as start_runtime

_MESSAGE_BYTES = 16 << 20


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("CODEMODE_")]:
        monkeypatch.delenv(name)


# -- settings -------------------------------------------------------------------------------


def test_runtime_connection_settings_default_to_none() -> None:
    settings = load_runtime()
    assert settings.max_connection_age_s is None
    assert settings.max_connection_age_grace_s is None
    options = dict(server_options(settings))
    assert "grpc.max_connection_age_ms" not in options
    assert "grpc.max_connection_age_grace_ms" not in options
    # The registry's pings are accepted whatever the age settings.
    assert options["grpc.keepalive_permit_without_calls"] == 1
    assert options["grpc.http2.min_ping_interval_without_data_ms"] == 20_000


def test_runtime_connection_age_from_env_over_yaml(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "runtime.yaml"
    config.write_text("max_connection_age_s: 60\nmax_connection_age_grace_s: 90.5\n")
    settings = load_runtime(config)
    assert (settings.max_connection_age_s, settings.max_connection_age_grace_s) == (60, 90.5)
    monkeypatch.setenv("CODEMODE_RUNTIME_MAX_CONNECTION_AGE_S", "300")
    monkeypatch.setenv("CODEMODE_RUNTIME_MAX_CONNECTION_AGE_GRACE_S", "660")
    options = dict(server_options(load_runtime(config)))
    assert options["grpc.max_connection_age_ms"] == 300_000
    assert options["grpc.max_connection_age_grace_ms"] == 660_000
    assert options["grpc.max_receive_message_length"] == 96 << 20


def test_runtime_age_without_grace_keeps_streams_open() -> None:
    options = dict(server_options(load_runtime(max_connection_age_s=0.0004)))
    assert options["grpc.max_connection_age_ms"] == 1  # rounded up, never 0
    assert "grpc.max_connection_age_grace_ms" not in options


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("max_connection_age_s", "0", "greater than 0"),
        ("max_connection_age_s", "-5", "greater than 0"),
        ("max_connection_age_s", "soon", "valid number"),
        ("max_connection_age_s", "nan", "finite number"),
        ("max_connection_age_s", "inf", "finite number"),
        ("max_connection_age_s", "3000000", "less than or equal to 2147483"),
        ("max_connection_age_grace_s", "0", "greater than 0"),
    ],
)
def test_invalid_runtime_connection_age_fails_clearly(
    monkeypatch: pytest.MonkeyPatch, field: str, value: str, expected: str
) -> None:
    monkeypatch.setenv("CODEMODE_RUNTIME_MAX_CONNECTION_AGE_S", "300")
    monkeypatch.setenv(f"CODEMODE_RUNTIME_{field.upper()}", value)
    with pytest.raises(RuntimeConfigError) as caught:
        load_runtime()
    assert field in str(caught.value) and expected in str(caught.value)


def test_runtime_grace_without_age_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "runtime.yaml"
    config.write_text("max_connection_age_grace_s: 660\n")
    with pytest.raises(RuntimeConfigError, match="no effect without max_connection_age_s"):
        load_runtime(config)


def test_registry_keepalive_defaults_to_no_pings() -> None:
    settings = load_registry()
    assert settings.runtime_keepalive_s is None
    options = dict(channel_options(settings.max_message_bytes, settings.runtime_keepalive_s))
    assert options["grpc.lb_policy_name"] == "round_robin"
    assert not [name for name in options if "keepalive" in name or "ping" in name]


def test_registry_keepalive_from_env_over_yaml(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "registry.yaml"
    config.write_text("runtime_keepalive_s: 45\n")
    assert load_registry(config).runtime_keepalive_s == 45
    monkeypatch.setenv("CODEMODE_REGISTRY_RUNTIME_KEEPALIVE_S", "30")
    settings = load_registry(config)
    assert settings.runtime_keepalive_s == 30
    options = dict(channel_options(settings.max_message_bytes, settings.runtime_keepalive_s))
    assert options["grpc.keepalive_time_ms"] == 30_000
    assert options["grpc.keepalive_timeout_ms"] == 10_000
    assert options["grpc.keepalive_permit_without_calls"] == 1
    assert options["grpc.http2.max_pings_without_data"] == 0


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0", "greater than or equal to 20"),
        ("-30", "greater than or equal to 20"),
        # The runtime would answer pings this close with GOAWAY, ending the runs on them.
        ("19.9", "greater than or equal to 20"),
        ("often", "valid number"),
        ("1e9", "less than or equal to 2147483"),
    ],
)
def test_invalid_registry_keepalive_fails_clearly(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: str
) -> None:
    monkeypatch.setenv("CODEMODE_REGISTRY_RUNTIME_KEEPALIVE_S", value)
    with pytest.raises(RegistryConfigError) as caught:
        load_registry()
    assert "runtime_keepalive_s" in str(caught.value) and expected in str(caught.value)


def test_registry_keepalive_floor_is_the_runtime_ping_interval() -> None:
    floor = load_registry(runtime_keepalive_s=20).runtime_keepalive_s
    assert floor is not None and floor * 1000 == MIN_PING_INTERVAL_MS


# -- real connections -----------------------------------------------------------------------

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_PING, _GOAWAY, _ACK = 0x6, 0x7, 0x1


class H2Tap:
    """A TCP proxy in front of a gRPC server that counts connections and notes when the client
    sends a PING frame (acks aside) and when the server sends a GOAWAY frame."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.connections = 0
        self.pings: list[float] = []
        self.goaways: list[float] = []
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def wait_until(self, condition: Callable[[], bool], within_s: float = 20) -> None:
        async with asyncio.timeout(within_s):
            while not condition():
                self._changed.clear()
                await self._changed.wait()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = self.upstream.rsplit(":", 1)
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        self.connections += 1
        self._changed.set()
        for task in (
            asyncio.create_task(self._pump(reader, up_writer, from_client=True)),
            asyncio.create_task(self._pump(up_reader, writer, from_client=False)),
        ):
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, *, from_client: bool
    ) -> None:
        buffer = b""
        preface = from_client
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
                buffer += data
                if preface:
                    if len(buffer) < len(_PREFACE):
                        continue
                    buffer, preface = buffer[len(_PREFACE) :], False
                while len(buffer) >= 9:
                    length = int.from_bytes(buffer[:3], "big")
                    if len(buffer) < 9 + length:
                        break
                    kind, flags = buffer[3], buffer[4]
                    buffer = buffer[9 + length :]
                    if from_client and kind == _PING and not flags & _ACK:
                        self.pings.append(time.monotonic())
                    elif not from_client and kind == _GOAWAY:
                        self.goaways.append(time.monotonic())
                    else:
                        continue
                    self._changed.set()
        except ConnectionError:
            pass
        finally:
            with contextlib.suppress(ConnectionError, RuntimeError):
                dst.close()


@contextlib.asynccontextmanager
async def _runtime_behind_tap(**settings: Any) -> AsyncIterator[H2Tap]:
    runtime = await start_runtime(RuntimeSettings(listen="127.0.0.1:0", pool_size=1, **settings))
    tap = H2Tap(runtime.address)
    try:
        yield tap
    finally:
        await tap.close()
        await runtime.stop(0)


async def _run(client: GrpcRuntime, program: str) -> RunTerminal:
    stream = await client.open_run(
        RunSpec(program=program, language="python", binding_names=(), token=b"t", timeout=30)
    )
    try:
        async for event in stream.events():
            if isinstance(event, RunTerminal):
                return event
        raise AssertionError("no terminal")
    finally:
        await stream.close()


async def test_runs_in_flight_outlive_the_max_connection_age() -> None:
    async with _runtime_behind_tap(max_connection_age_s=1, max_connection_age_grace_s=5) as tap:
        client = GrpcRuntime([await tap.start()], _MESSAGE_BYTES)
        try:
            assert (await _run(client, "return 'warm'")).value_json == '"warm"'
            opened = time.monotonic()
            long_run = asyncio.create_task(
                _run(client, "import time\ntime.sleep(3)\nreturn 'slept'")
            )
            # The runtime sends GOAWAY once the connection is ~1 s old (+-10 %), mid-run.
            await tap.wait_until(lambda: bool(tap.goaways))
            assert not long_run.done()
            # New runs go over a fresh connection while the old one drains.
            assert (await _run(client, "return 'after'")).value_json == '"after"'
            assert tap.connections >= 2
            terminal = await asyncio.wait_for(long_run, 20)
            assert terminal.ok and terminal.value_json == '"slept"'
            assert time.monotonic() - opened >= 3 > tap.goaways[0] - opened
        finally:
            await client.close()


async def test_runs_longer_than_the_grace_are_cut_off() -> None:
    async with _runtime_behind_tap(max_connection_age_s=0.5, max_connection_age_grace_s=1) as tap:
        client = GrpcRuntime([await tap.start()], _MESSAGE_BYTES)
        try:
            with pytest.raises(RuntimeLost):
                await asyncio.wait_for(_run(client, "import time\ntime.sleep(30)"), 20)
            assert tap.goaways
        finally:
            await client.close()


async def test_registry_channel_pings_idle_runtime_connections() -> None:
    async with _runtime_behind_tap() as tap, _runtime_behind_tap() as quiet:
        pinging = GrpcRuntime([await tap.start()], _MESSAGE_BYTES, keepalive_s=0.5)
        silent = GrpcRuntime([await quiet.start()], _MESSAGE_BYTES)
        try:
            for client in (pinging, silent):
                assert (await _run(client, "return 1")).value_json == "1"
            idle = time.monotonic()
            # Three pings with no data between them: sent without calls (keepalive_permit_
            # without_calls), and past the two a channel sends by default before it waits for
            # data (max_pings_without_data). Pings this close are below the runtime's floor:
            # it tolerates two strikes before it answers GOAWAY, enough for this check.
            await tap.wait_until(lambda: len([t for t in tap.pings if t > idle]) >= 3)
            after = [t for t in tap.pings if t > idle]
            assert all(b - a >= 0.4 for a, b in itertools.pairwise(after))
            # No keepalive: no pings once idle. (A BDP probe may answer the run's last data
            # frames right after `idle`, on either channel; by the second ping of the pinging
            # one, a keepalive ping, it is long over.)
            assert not [t for t in quiet.pings if t > after[1]]
        finally:
            await pinging.close()
            await silent.close()


# -- connection bounds (both services) -----------------------------------------------------


@pytest.mark.parametrize("load", [load_registry, load_runtime])
def test_connection_bounds_default_on_and_reach_the_server(load: Callable[..., Any]) -> None:
    from codemode_common.grpc_server import base_options

    settings = load()
    options = dict(base_options(_MESSAGE_BYTES, settings.connection_limits()))
    assert options["grpc.max_allowed_incoming_connections"] == 1000
    assert options["grpc.server_handshake_timeout_ms"] == 10_000
    assert options["grpc.max_connection_idle_ms"] == 300_000
    assert options["grpc.keepalive_time_ms"] == 60_000
    assert options["grpc.keepalive_timeout_ms"] == options["grpc.http2.ping_timeout_ms"] == 20_000
    assert options["grpc.http2.max_ping_strikes"] == 2
    idle_off = load(max_connection_idle_s=None, max_connections=7).connection_limits()
    options = dict(base_options(_MESSAGE_BYTES, idle_off))
    assert "grpc.max_connection_idle_ms" not in options
    assert options["grpc.max_allowed_incoming_connections"] == 7


def test_the_runtime_keeps_its_ping_floor_beside_the_bounds() -> None:
    options = dict(server_options(load_runtime(max_connections=5)))
    assert options["grpc.max_allowed_incoming_connections"] == 5
    assert options["grpc.http2.min_ping_interval_without_data_ms"] == MIN_PING_INTERVAL_MS


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("max_connections", "0", "greater than or equal to 1"),
        ("max_connections", "many", "valid integer"),
        ("handshake_timeout_s", "0", "greater than 0"),
        ("handshake_timeout_s", "inf", "finite number"),
        ("max_connection_idle_s", "-1", "greater than 0"),
        ("keepalive_time_s", "3000000", "less than or equal to 2147483"),
        ("keepalive_timeout_s", "nan", "finite number"),
    ],
)
@pytest.mark.parametrize("service", ["registry", "runtime"])
def test_invalid_connection_bounds_fail_clearly(
    monkeypatch: pytest.MonkeyPatch, service: str, field: str, value: str, expected: str
) -> None:
    monkeypatch.setenv(f"CODEMODE_{service.upper()}_{field.upper()}", value)
    load, error = (
        (load_registry, RegistryConfigError)
        if service == "registry"
        else (load_runtime, RuntimeConfigError)
    )
    with pytest.raises(error) as caught:
        load()
    assert field in str(caught.value) and expected in str(caught.value)


def test_a_bound_above_the_descriptor_limit_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import resource

    from codemode_common.grpc_server import DESCRIPTOR_RESERVE, warn_if_descriptors_short

    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert not warn_if_descriptors_short("registry", 1)
    if soft == resource.RLIM_INFINITY:
        return
    with caplog.at_level("WARNING"):
        assert warn_if_descriptors_short("registry", soft - DESCRIPTOR_RESERVE + 1)
    assert "max_connections" in caplog.text and str(soft) in caplog.text
