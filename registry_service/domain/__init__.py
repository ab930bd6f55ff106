"""The registry's domain: scopes, the tool catalog, policy, the execution pipeline, the history
record and Cordis.

Nothing in this package imports grpc, the generated messages, `registry_service.presentation`,
the history stores or the servicers, and no module of the project is in an import circle
(`tests/unit/test_import_graph.py`); the servicers in `registry_service` translate.
"""
