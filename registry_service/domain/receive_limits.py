"""How large a message a stream's client receives, and so what the registry may send it.

A gRPC client refuses a message larger than its channel's receive limit by ending the whole
stream (RESOURCE_EXHAUSTED). A tool provider or an approver serves many agents over one stream,
so one agent's large message would cut it for all of them. Each declares its limit when it opens
its stream (`max_receive_message_bytes` of OpenProvider and OpenApprover, see
proto/codemode/registry/v1/registry_service.proto); the registry sends it nothing larger.
"""

from __future__ import annotations

from dataclasses import dataclass

# What a client that declares no limit receives: gRPC's default receive limit.
DEFAULT_RECEIVE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ReceiveLimits:
    max_send_bytes: int
    """The most the registry sends anyone (its `max_message_bytes`)."""

    def of(self, declared: int) -> int:
        """The largest message (encoded bytes) sent to a client that declared `declared`
        (0 or less: nothing declared, gRPC's default), never more than the registry sends."""
        receives = declared if declared > 0 else DEFAULT_RECEIVE_BYTES
        return min(receives, self.max_send_bytes)


def too_large(what: str, encoded_bytes: int, limit: int, receiver: str) -> str:
    """Why a message was not sent, for the error the call gets."""
    return f"the {what} is {encoded_bytes} bytes, larger than the {limit} bytes {receiver} receives"
