"""Telemetry as an observer of calls: every span event, span and metric of the registry's calls
comes from here (the spans and instruments themselves are registry_service/domain/telemetry.py).

A model-direct call's span opens when the call is received and ends with it; a nested call's
opens when its binding call is admitted (so it includes the scheduler queue wait) and ends at its
commit, or when it is abandoned. Stages are span events stamped at the stage's start.
"""

from __future__ import annotations

import time

from registry_service.domain.events import (
    CallFailed,
    CallFinished,
    CallReceived,
    NestedCallAbandoned,
    NestedCallReceived,
    NestedCallRefused,
    NestedCallSettled,
    NestedCallStarted,
    Observed,
    ObservedCall,
    RunEnded,
    RunStarted,
    StageTimed,
    ToolResolved,
)
from registry_service.domain.observers import Write
from registry_service.domain.telemetry import (
    ABANDONED,
    APPROVAL_WAIT,
    QUEUE_WAIT,
    RegistryTelemetry,
    outcome_of,
)


class TelemetryObserver:
    def __init__(self, telemetry: RegistryTelemetry) -> None:
        self.telemetry = telemetry

    def observe(self, event: Observed) -> Write | None:
        telemetry = self.telemetry
        if isinstance(event, StageTimed):
            event.trace.stage(event.stage, event.started_ns, event.ended_ns, **event.attributes)
            if event.stage == APPROVAL_WAIT:
                seconds = (event.ended_ns - event.started_ns) / 1e9
                telemetry.approval_waited(str(event.attributes.get("outcome", "")), seconds)
        elif isinstance(event, ToolResolved):
            event.trace.describe(event.description)
        elif isinstance(event, CallReceived):
            self._open(event.call)
        elif isinstance(event, CallFinished):
            event.call.trace.end(event.result)
        elif isinstance(event, CallFailed):
            event.call.trace.fail(event.error)
        elif isinstance(event, NestedCallReceived):
            self._open(event.call)
            telemetry.nested_received()
        elif isinstance(event, NestedCallStarted) and event.call is not None:
            call = event.call
            submitted_ns, started_ns = int(call.received_at * 1e9), int(event.started_at * 1e9)
            call.trace.stage(QUEUE_WAIT, submitted_ns, started_ns)
            telemetry.queue_waited(call.name, event.started_at - call.received_at)
        elif isinstance(event, NestedCallSettled) and event.call is not None:
            assert event.result is not None
            call = event.call
            outcome = outcome_of(event.result)
            call.trace.end(event.result, outcome, "exclusive" if event.exclusive else "parallel")
            telemetry.nested_settled(call.name, outcome, time.time() - call.received_at)
        elif isinstance(event, NestedCallAbandoned):
            event.call.trace.end(event.result, ABANDONED)
            telemetry.nested_abandoned()
        elif isinstance(event, NestedCallRefused):
            telemetry.nested_refused(event.reason, event.tool_name)
        elif isinstance(event, RunStarted):
            telemetry.run_started()
        elif isinstance(event, RunEnded):
            telemetry.run_ended()
        return None

    def _open(self, call: ObservedCall) -> None:
        """Starts the call's `execute_tool` span, unless its caller already did."""
        if call.trace.recording:
            return
        call.trace = self.telemetry.start_call(
            call_id=call.call_id,
            name=call.name,
            root_call_id=call.root_call_id,
            agent=call.agent or None,
            parent_call_id=call.parent_call_id,
            traceparent=call.traceparent,
            tracestate=call.tracestate,
        )
