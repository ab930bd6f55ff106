"""Channels to a registry with message limits that match the registry's own.

gRPC's default receive limit is 4 MiB; the registry accepts and sends messages up to its
`max_message_bytes` (16 MiB by default, configurable). A client on the default limit fails
on valid 4-16 MiB results, and a tool provider on it loses its whole stream (and with it
every tool it registered, failing other callers too) on one large argument. These channels
accept up to 64 MiB each way, as the TypeScript client's do, which covers every registry
limit up to that size.

Retries: one gRPC service-config retry policy (`service_config.json`, the same file as the
TypeScript client's): idempotent reads on UNAVAILABLE and RESOURCE_EXHAUSTED, `ExecuteToolCall`
only on RESOURCE_EXHAUSTED (an admission refusal, nothing of the call started; or a code
runtime at capacity, `CODE_RUNTIME_EXHAUSTED`: the program did not run), nothing else.
gRPC runs every attempt inside the call's one deadline, and waits as long as the server's
pushback (`grpc-retry-pushback-ms`, sent beside RetryInfo) says.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Sequence
from importlib import resources
from typing import Any

import grpc

__all__ = [
    "CHANNEL_OPTIONS",
    "GRPC_DEFAULT_RECEIVE_BYTES",
    "MAX_MESSAGE_BYTES",
    "channel_target",
    "open_channel",
    "receive_limit",
    "service_config",
]

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
)
# What a channel receives unless told otherwise: gRPC's default receive limit.
GRPC_DEFAULT_RECEIVE_BYTES = 4 * 1024 * 1024
# -1 ("unlimited") still cannot receive more than gRPC's int32 message length.
_UNLIMITED = 2**31 - 1
_RECEIVE_LIMITS: weakref.WeakKeyDictionary[grpc.aio.Channel, int] = weakref.WeakKeyDictionary()
_TARGETS: weakref.WeakKeyDictionary[grpc.aio.Channel, str] = weakref.WeakKeyDictionary()


def channel_target(channel: grpc.aio.Channel) -> str:
    """The address `channel` was opened to, for error messages: as `open_channel` recorded
    it, else what grpc.aio's channel keeps (not public API: "" if it is not there)."""
    recorded = _TARGETS.get(channel)
    if recorded is not None:
        return recorded
    target = getattr(getattr(channel, "_channel", None), "target", None)
    return target.decode(errors="replace") if isinstance(target, bytes) else ""


def receive_limit(channel: grpc.aio.Channel) -> int:
    """The largest message `channel` receives: as `open_channel` set it up, else gRPC's
    default (a channel made any other way is taken to have it). A tool provider or an approver
    declares it when it opens its stream, so that the registry never sends it an invocation or
    an approval request it would refuse, which would end the stream for every caller."""
    return _RECEIVE_LIMITS.get(channel, GRPC_DEFAULT_RECEIVE_BYTES)


def _receive_option(options: Sequence[tuple[str, int | str]]) -> int:
    limit = GRPC_DEFAULT_RECEIVE_BYTES
    for key, value in options:  # a later option overrides an earlier one, as in gRPC
        if key == "grpc.max_receive_message_length" and isinstance(value, int):
            limit = _UNLIMITED if value < 0 else value
    return limit


DEFAULT_ATTEMPTS = 4
_POLICY: dict[str, Any] = json.loads(
    resources.files("codemode_client").joinpath("service_config.json").read_text()
)


def service_config(max_attempts: int = DEFAULT_ATTEMPTS) -> str:
    """The retry service config as gRPC takes it, with `max_attempts` attempts in total (1:
    no retries at all)."""
    config = json.loads(json.dumps(_POLICY))
    if max_attempts <= 1:
        config["methodConfig"] = []
    for method in config["methodConfig"]:
        method["retryPolicy"]["maxAttempts"] = max_attempts
    return json.dumps(config)


def _bearer_interceptors(token: str) -> list[Any]:
    """Interceptors adding `authorization: Bearer <token>` to every call (also over plaintext,
    which gRPC's own token call credentials refuse: a loopback registry may take tokens
    without TLS). One per call kind: a grpc.aio channel files each interceptor under the
    first kind it is an instance of."""
    header = ("authorization", f"Bearer {token}")

    def with_token(details: Any) -> Any:
        return details._replace(metadata=grpc.aio.Metadata(*(details.metadata or ()), header))

    async def intercept(continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(with_token(details), request)

    kinds: tuple[tuple[Any, str], ...] = (
        (grpc.aio.UnaryUnaryClientInterceptor, "intercept_unary_unary"),
        (grpc.aio.UnaryStreamClientInterceptor, "intercept_unary_stream"),
        (grpc.aio.StreamUnaryClientInterceptor, "intercept_stream_unary"),
        (grpc.aio.StreamStreamClientInterceptor, "intercept_stream_stream"),
    )
    return [
        type(f"Bearer{i}", (base,), {method: staticmethod(intercept)})()
        for i, (base, method) in enumerate(kinds)
    ]


def open_channel(
    target: str,
    *,
    credentials: grpc.ChannelCredentials | None = None,
    options: Sequence[tuple[str, int | str]] = (),
    max_attempts: int = DEFAULT_ATTEMPTS,
    bearer_token: str | None = None,
) -> grpc.aio.Channel:
    """An aio channel to `target` (TLS with `credentials`, else plaintext) with the message
    limits and the retry policy above; `options` are added after them (a later option
    overrides an earlier one). `bearer_token`: sent with every call (a registry that
    authenticates static tokens or JWTs)."""
    interceptors = None if bearer_token is None else _bearer_interceptors(bearer_token)
    merged: list[tuple[str, int | str]] = [
        *CHANNEL_OPTIONS,
        ("grpc.enable_retries", 1),
        ("grpc.service_config", service_config(max_attempts)),
        *options,
    ]
    if credentials is not None:
        channel = grpc.aio.secure_channel(
            target, credentials, options=merged, interceptors=interceptors
        )
    else:
        channel = grpc.aio.insecure_channel(target, options=merged, interceptors=interceptors)
    _RECEIVE_LIMITS[channel] = _receive_option(merged)
    _TARGETS[channel] = target
    return channel
