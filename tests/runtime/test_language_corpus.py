"""Every registered language backend passes the language conformance corpus
(``language_corpus/``) through the real ``RuntimeService.Run`` API on loopback: one runtime per
language, every case in turn, each ending exactly as the corpus says."""

from __future__ import annotations

import pytest

from runtime_service.languages import backends
from runtime_service.worker_process import WorkerSpec
from tests.runtime.conftest import connected, grpc_settings, serving
from tests.runtime.language_corpus import corpus


def _served(name: str) -> pytest.MarkDecorator | tuple[()]:
    backend = next(item for item in backends() if item.name == name)
    why = backend.unavailable(WorkerSpec())
    return pytest.mark.skip(reason=f"{name} is not served here: {why}") if why else ()


LANGUAGES = [pytest.param(item.name, marks=_served(item.name)) for item in backends()]


def test_every_builtin_language_has_a_source_for_every_case() -> None:
    ids = {case.id for case in corpus.cases()}
    assert len(ids) == len(corpus.cases())  # ids are unique
    for backend in backends():
        table = corpus.sources(backend.name)
        assert set(table) == ids, backend.name


@pytest.mark.parametrize("language", LANGUAGES)
async def test_the_language_passes_the_corpus(language: str) -> None:
    async with serving(grpc_settings()) as running, connected(running) as stub:
        ran, failures = await corpus.conformance(stub, language)
    assert ran == [case.id for case in corpus.cases()]
    assert failures == {}
