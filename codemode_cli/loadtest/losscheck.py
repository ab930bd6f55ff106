"""After the load: read the agent's history and account for every nested call.

Per program, four counts must agree: the nested calls the program says it made, the
`nested_settled` events its stream carried, and the `tool/code-dispatch-start` and
`tool/code-dispatch` (settle) records in history. Programs that did not complete (cancelled at
the duration limit, or failed) have no count of their own and an incomplete stream, so for them
only start records vs settle records are compared, once their outer `tool/result` is written
(the registry writes it only after quiescence). A program refused by admission control
must have left no record at all: any is counted as extra.

The start records also give a queue wait as seen from the program: each carries the time the
scheduler started the call and the arguments, whose `i` names the program's own submission
stamp (so it includes the worker -> runtime -> registry relay; the scheduler's own figure is
`nested_started.queue_wait_ms`).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from codemode_cli.loadtest.driver import OK, REFUSED, Outcome
from codemode_cli.loadtest.progress import Progress
from codemode_wire.api.registry.v1 import registry_service_pb2 as rpb

START, SETTLE, RESULT = "tool/code-dispatch-start", "tool/code-dispatch", "tool/result"
SETTLE_WAIT_S = 10.0  # how long unfinished calls may take to reach quiescence
MAX_LISTED = 20


@dataclass
class Tally:
    starts: dict[int, float] = field(default_factory=dict)  # argument `i` -> start time (wall)
    start_records: int = 0
    settle_records: int = 0
    has_result: bool = False
    records: int = 0

    def add(self, record: Any) -> None:
        self.records += 1
        if record.kind == START:
            self.start_records += 1
            try:
                i = int(json.loads(record.arguments_json)["i"])
            except (ValueError, KeyError, TypeError):
                return
            self.starts[i] = record.time.ToNanoseconds() / 1e9
        elif record.kind == SETTLE:
            self.settle_records += 1
        elif record.kind == RESULT and not record.parent_call_id:
            self.has_result = True


async def _pages(stub: Any, agent: str, call_id: str = "") -> Any:
    token = ""
    while True:
        page = await stub.ListHistory(
            rpb.ListHistoryRequest(agent=agent, call_id=call_id, page_size=1000, page_token=token)
        )
        for record in page.records:
            yield record
        token = page.next_page_token
        if not token:
            return


async def scan(
    stub: Any, agent: str, outcomes: list[Outcome], progress: Progress
) -> dict[str, Tally]:
    """Tallies per outer call id, after unfinished calls reached quiescence (bounded wait)."""
    tallies: dict[str, Tally] = {o.call_id: Tally() for o in outcomes}
    seen = 0
    async for record in _pages(stub, agent):
        tally = tallies.get(record.root_call_id or record.call_id)
        if tally is not None:
            tally.add(record)
        seen += 1
        if seen % 10_000 == 0:
            progress.note(f"loadtest: checking history, {seen} records")
    loop = asyncio.get_running_loop()
    waiting_until = loop.time() + SETTLE_WAIT_S
    pending = [
        o.call_id
        for o in outcomes
        if o.status not in (OK, REFUSED) and not tallies[o.call_id].has_result
    ]
    while pending and loop.time() < waiting_until:
        await asyncio.sleep(0.2)
        for call_id in pending:
            tally = Tally()
            async for record in _pages(stub, agent, call_id):
                tally.add(record)
            tallies[call_id] = tally
        pending = [c for c in pending if not tallies[c].has_result]
    return tallies


def program_queue_waits(
    outcomes: list[Outcome], tallies: dict[str, Tally]
) -> tuple[list[float], int]:
    """Milliseconds from the program's submission to the scheduler's start, and how many came
    out negative (clock steps; clamped to 0)."""
    waits, negative = [], 0
    for outcome in outcomes:
        if outcome.status != OK:
            continue
        for i, started in tallies[outcome.call_id].starts.items():
            if 0 <= i < len(outcome.submitted) and outcome.submitted[i] > 0:
                wait = (started - outcome.submitted[i]) * 1e3
                if wait < 0:
                    negative += 1
                waits.append(max(wait, 0.0))
    return waits, negative


def check(outcomes: list[Outcome], tallies: dict[str, Tally]) -> dict[str, Any]:
    made = events = starts = settles = lost = extra = unresolved = checked = refused = 0
    never_recorded = 0
    mismatches: list[dict[str, Any]] = []
    for outcome in outcomes:
        tally = tallies[outcome.call_id]
        if outcome.status == REFUSED:
            refused += 1
            missing, surplus = 0, tally.records  # nothing may have started
        elif outcome.status == OK and outcome.made is not None:
            n, settled = outcome.made, tally.settle_records
            missing = max(0, n - settled, n - outcome.nested_settled, tally.start_records - settled)
            surplus = max(0, settled - n, outcome.nested_settled - n, settled - tally.start_records)
            made += outcome.made
            events += outcome.nested_settled
        elif not tally.records:
            # Failed or cancelled before the registry recorded anything of it (a replica that
            # was already gone, say): nothing started, nothing to balance.
            never_recorded += 1
            missing = surplus = 0
        elif not tally.has_result:
            unresolved += 1  # never reached quiescence within the wait: not judged
            continue
        else:
            missing = max(0, tally.start_records - tally.settle_records)
            surplus = max(0, tally.settle_records - tally.start_records)
        checked += 1
        starts += tally.start_records
        settles += tally.settle_records
        lost += missing
        extra += surplus
        if (missing or surplus) and len(mismatches) < MAX_LISTED:
            mismatches.append(
                {
                    "call_id": outcome.call_id,
                    "status": outcome.status,
                    "made": outcome.made,
                    "settled_events": outcome.nested_settled,
                    "start_records": tally.start_records,
                    "settle_records": tally.settle_records,
                }
            )
    return {
        "checked_programs": checked,
        "refused_programs": refused,
        "unresolved_programs": unresolved,
        "never_recorded_programs": never_recorded,
        "made": made,
        "settled_events": events,
        "start_records": starts,
        "settle_records": settles,
        "lost": lost,
        "extra": extra,
        "mismatches": mismatches,
    }
