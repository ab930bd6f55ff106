"""`FrameBatches`: frames of one loop turn in one batch, a lone frame at once, fair between
runs (a flood delays another run by one batch at most), bounded by `room`."""

from __future__ import annotations

import asyncio

from codemode_common.frame_batches import FrameBatches


def _batches(per_run: int = 4, max_bytes: int = 1000) -> FrameBatches[str]:
    return FrameBatches(len, per_run=per_run, max_bytes=max_bytes)


async def test_a_lone_frame_leaves_at_once_and_one_turns_frames_together() -> None:
    batches = _batches()
    waiting = asyncio.ensure_future(batches.next())
    await asyncio.sleep(0)
    batches.put(1, "a")
    assert await waiting == [(1, "a")]
    batches.put(1, "b")
    batches.put(2, "c")
    assert await batches.next() == [(1, "b"), (2, "c")]


async def test_a_flooding_run_delays_another_by_one_batch_at_most() -> None:
    batches = _batches(per_run=4)
    for i in range(1000):
        batches.put(1, f"f{i}")
    batches.put(2, "quiet")
    first = await batches.next()
    assert first == [(1, "f0"), (1, "f1"), (1, "f2"), (1, "f3"), (2, "quiet")]
    batches.put(2, "again")  # after a batch of the flood: in the very next one
    assert (2, "again") in (await batches.next() or [])


async def test_the_byte_limit_ends_a_batch_and_the_cut_run_leads_the_next() -> None:
    batches = _batches(per_run=10, max_bytes=10)
    batches.put(1, "x" * 50)  # larger than a batch: goes alone
    batches.put(1, "aaaa")
    batches.put(2, "bbbbbbbb")
    assert await batches.next() == [(1, "x" * 50)]
    assert await batches.next() == [(1, "aaaa")]
    assert await batches.next() == [(2, "bbbbbbbb")]


async def test_room_holds_a_producer_back_until_its_frames_leave() -> None:
    batches = _batches(per_run=2)
    batches.put(1, "a")
    batches.put(1, "b")
    held = asyncio.ensure_future(batches.room(1))
    await asyncio.sleep(0)
    assert not held.done()
    await batches.room(2)  # another run is not held
    assert await batches.next() == [(1, "a"), (1, "b")]
    await asyncio.wait_for(held, 5)


async def test_close_drains_then_ends_and_drops_later_frames() -> None:
    batches = _batches()
    batches.put(1, "a")
    batches.close()
    batches.put(1, "late")
    assert await batches.next() == [(1, "a")]
    assert await batches.next() is None
