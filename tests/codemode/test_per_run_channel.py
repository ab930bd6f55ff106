"""The codemode suite's main scenarios again, with runs on per-run `Run` streams
(`runtime_channel: per-run`, deprecated: kept for one release as the same-run baseline of the
multiplexed channel, the default): the same tests, collected here with a `make_stack` that sets
it, so each asserts exactly what it does on the multiplexed channel."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from tests.codemode.conftest import Stack
from tests.codemode.test_admission import (  # noqa: F401  (collected here again)
    test_concurrent_runs_per_agent,
    test_nested_calls_in_flight,
)
from tests.codemode.test_bridge import (  # noqa: F401
    test_deep_arguments_and_proto_named_tool,
    test_lossy_arguments_are_rejected_before_dispatch,
    test_nested_hooks_see_an_opaque_parent_token,
)
from tests.codemode.test_cancellation import (  # noqa: F401
    test_a_stopped_call_kills_its_worker_and_aborts_its_nested_call,
)
from tests.codemode.test_faults import (  # noqa: F401
    test_forged_and_foreign_tokens_are_refused,
)
from tests.codemode.test_message_limits import (  # noqa: F401
    test_binding_call_too_large_to_forward_fails_only_that_call,
    test_output_over_the_message_limit_is_an_output_limit_outcome,
    test_tool_result_too_large_for_the_program_fails_only_that_call,
)
from tests.codemode.test_run_code_basics import (  # noqa: F401
    test_failed_run_reports_kind_message_and_captured_output,
    test_sequential_awaits_value_content_and_records,
    test_tool_errors_reject_the_program_call,
)
from tests.codemode.test_runtime_outage import (  # noqa: F401
    test_a_runtime_killed_mid_run_is_unavailable_not_retryable_and_settles,
    test_no_reachable_runtime_is_unavailable_retryable_and_recorded,
    test_runs_go_past_dead_and_shutting_down_runtimes_until_none_is_left,
)
from tests.codemode.test_tenant_capacity import (  # noqa: F401
    test_one_agent_flooding_run_code_leaves_another_agent_working,
    test_run_code_on_a_full_runtime_is_retryable_capacity,
)
from tests.registry.conftest import Harness

PER_RUN = {"runtime_channel": "per-run"}


@pytest.fixture
def make_stack(make_stack: Callable[..., Any]) -> Callable[..., Any]:
    @contextlib.asynccontextmanager
    async def factory(**settings: Any) -> AsyncIterator[Stack]:
        async with make_stack(**{**PER_RUN, **settings}) as stack:
            yield stack

    return factory


@pytest.fixture
def make_registry(make_registry: Callable[..., Any]) -> Callable[..., Any]:
    @contextlib.asynccontextmanager
    async def factory(registry: Any = None, **settings: Any) -> AsyncIterator[Harness]:
        async with make_registry(registry, **{**PER_RUN, **settings}) as harness:
            yield harness

    return factory
