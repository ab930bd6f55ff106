"""A system-prompt section: the unit prompt hooks (domain policy) and assembly (presentation)
both work with. It lives in the domain so that policy never imports presentation."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Section:
    id: str
    order: int
    text: str
