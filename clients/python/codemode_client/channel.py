"""Channels to a registry with message limits that match the registry's own.

gRPC's default receive limit is 4 MiB; the registry accepts and sends messages up to its
`max_message_bytes` (16 MiB by default, configurable). A client on the default limit fails
on valid 4-16 MiB results, and a tool provider on it loses its whole stream (and with it
every tool it registered, failing other callers too) on one large argument. These channels
accept up to 64 MiB each way, as the TypeScript client's do, which covers every registry
limit up to that size.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

__all__ = ["CHANNEL_OPTIONS", "MAX_MESSAGE_BYTES", "open_channel"]

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
)


def open_channel(
    target: str,
    *,
    credentials: grpc.ChannelCredentials | None = None,
    options: Sequence[tuple[str, int | str]] = (),
) -> grpc.aio.Channel:
    """An aio channel to `target` (TLS with `credentials`, else plaintext) with the message
    limits above; `options` are added after them (a later option overrides an earlier one)."""
    merged = [*CHANNEL_OPTIONS, *options]
    if credentials is not None:
        return grpc.aio.secure_channel(target, credentials, options=merged)
    return grpc.aio.insecure_channel(target, options=merged)
