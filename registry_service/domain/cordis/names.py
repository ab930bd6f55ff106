"""The names of the seven Cordis model tools, in a module of their own: who may call them
(`domain.tool_access`) is decided without importing the runner that implements them."""

from __future__ import annotations

INSPECT_LIST = "cordis_inspect_list"
INSPECT_QUERY = "cordis_inspect_query"
INSPECT_SELF = "cordis_inspect_self"
DEFINE = "cordis_define"
RUN = "cordis_run"
STOP = "cordis_stop"
UNDEFINE = "cordis_undefine"
NAMES = (INSPECT_LIST, INSPECT_QUERY, INSPECT_SELF, DEFINE, RUN, STOP, UNDEFINE)
