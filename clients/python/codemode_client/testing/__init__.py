"""Test your agents against a real registry and runtime (docs/clients.md, "Testing your agents").

Installed with the `testing` extra (`pip install "codemode-client[testing]"`), the pytest plugin
(`codemode_client.testing.plugin`, registered through the `pytest11` entry point) provides the
fixtures `codemode_services` (one `codemode up` per session: a registry and a runtime as
subprocesses on free loopback ports, stopped by pid) and `codemode` (a `Testbed` per test:
a client, fresh agents, in-process tool providers, a scripted model, trajectories). Everything
here works without pytest as well: `start_services`, `Testbed`, `TurnScript`, `Trajectory`.
"""

from codemode_client.testing.services import (
    CodemodeServices,
    ServicesError,
    codemode_command,
    start_services,
    wait_gone,
)
from codemode_client.testing.testbed import Testbed
from codemode_client.testing.trajectory import ANY, Expected, NestedCall, Trajectory, expect
from codemode_client.testing.turn_script import (
    Answer,
    CallTool,
    Conversation,
    RunCode,
    Step,
    Turn,
    TurnScript,
)

__all__ = [
    "ANY",
    "Answer",
    "CallTool",
    "CodemodeServices",
    "Conversation",
    "Expected",
    "NestedCall",
    "RunCode",
    "ServicesError",
    "Step",
    "Testbed",
    "Trajectory",
    "Turn",
    "TurnScript",
    "codemode_command",
    "expect",
    "start_services",
    "wait_gone",
]
