"""Attributes and events whose values are already clean, written into a span in one step.

The OpenTelemetry SDK validates ("cleans") every attribute value it is handed, one by one, and
wraps every event's attributes in a validating mapping of their own. For the spans of the hot
path (a span per nested call, each with a handful of str/int/float/bool values we built
ourselves) that is about a third of the span's cost. `set_clean_attributes` and
`add_clean_event` store such values as the SDK would have stored them, in one step under the
span's lock.

The direct write is taken only when cleaning could not change a thing: every value is exactly a
str, bool, int or float (what the SDK stores as given), and the span is an SDK span whose
limits cannot change what it stores (no attribute length limit, room under the count limits).
Everything else (a sequence value, another implementation, an SDK that no longer has the
expected internals, a configured limit) goes through the API as usual, so the exported span is
the same either way.

OpenTelemetry API only: the SDK is looked up in `sys.modules`, never imported, so a process
without it pays nothing and a span can only come from it once it has been imported.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

__all__ = ["add_clean_event", "direct_writes", "set_clean_attributes"]

_CLEAN = frozenset((str, bool, int, float))

_SDK_TRACE = "opentelemetry.sdk.trace"
# type(span) -> the SDK's `Event` class when spans of that type take direct writes, else None.
_direct: dict[type[Any], Any] = {}


def _event_class(span: trace.Span) -> Any:
    kind = type(span)
    try:
        return _direct[kind]
    except KeyError:
        pass
    event = None
    sdk = sys.modules.get(_SDK_TRACE)
    if sdk is not None and issubclass(kind, sdk.Span) and _has_internals(span):
        event = sdk.Event
    _direct[kind] = event
    return event


def _has_internals(span: Any) -> bool:
    """The SDK internals the direct writes rely on are there (checked once per span type)."""
    attributes = getattr(span, "_attributes", None)
    limits = getattr(span, "_limits", None)
    return (
        isinstance(getattr(attributes, "_dict", None), dict)
        and hasattr(span, "_lock")
        and hasattr(span, "_end_time")
        and hasattr(span, "_events")
        and callable(getattr(span, "_add_event", None))
        and all(
            hasattr(limits, name)
            for name in (
                "max_span_attributes",
                "max_span_attribute_length",
                "max_event_attributes",
                "max_attribute_length",
            )
        )
    )


def direct_writes(span: trace.Span) -> bool:
    """Whether spans of this type take the direct writes (else the API is used)."""
    return _event_class(span) is not None


def _clean(attributes: Mapping[str, AttributeValue]) -> bool:
    return all(type(value) in _CLEAN for value in attributes.values())


def set_clean_attributes(span: trace.Span, attributes: Mapping[str, AttributeValue]) -> None:
    """`span.set_attributes(attributes)`, in one step when the values need no cleaning."""
    if not attributes:
        return
    if _event_class(span) is not None and _clean(attributes):
        sdk_span: Any = span
        limits = sdk_span._limits
        if limits.max_span_attribute_length is None:
            with sdk_span._lock:
                if sdk_span._end_time is not None:
                    return  # the API warns and drops it: an ended span is immutable
                stored = sdk_span._attributes._dict
                maximum = limits.max_span_attributes
                if maximum is None or len(stored) + len(attributes) <= maximum:
                    stored.update(attributes)
                    return
    span.set_attributes(attributes)


def add_clean_event(
    span: trace.Span, name: str, attributes: dict[str, AttributeValue], timestamp: int
) -> None:
    """`span.add_event(name, attributes, timestamp)`, in one step when the values need no
    cleaning. `attributes` becomes the event's own: the caller must not change it afterwards.
    """
    event = _event_class(span)
    if event is not None and _clean(attributes):
        limits: Any = span._limits  # type: ignore[attr-defined]
        maximum = limits.max_event_attributes
        if limits.max_attribute_length is None and (maximum is None or len(attributes) <= maximum):
            span._add_event(event(name, attributes, timestamp))  # type: ignore[attr-defined]
            return
    span.add_event(name, attributes, timestamp=timestamp)
