"""Program languages of the runtime: one ``LanguageBackend`` per language, one table.

``backend.py`` is the contract, ``python.py`` and ``typescript.py`` the built-in backends,
``registry.py`` the table the runtime serves from.
"""

from runtime_service.languages.backend import (
    Capability,
    ExecLaunch,
    ExitSigns,
    LanguageBackend,
    Parse,
    Problem,
    SourceCheck,
    SourceKind,
    WorkerSettings,
    hinted,
)
from runtime_service.languages.registry import (
    DEFAULT_LANGUAGE,
    OPTIONAL,
    backend,
    backends,
    default_backend,
    enable,
    register,
)

__all__ = [
    "DEFAULT_LANGUAGE",
    "OPTIONAL",
    "Capability",
    "ExecLaunch",
    "ExitSigns",
    "LanguageBackend",
    "Parse",
    "Problem",
    "SourceCheck",
    "SourceKind",
    "WorkerSettings",
    "backend",
    "backends",
    "default_backend",
    "enable",
    "hinted",
    "register",
]
