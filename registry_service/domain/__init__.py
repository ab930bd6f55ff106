"""The registry's domain: scopes, the tool catalog, policy and the execution pipeline.

Nothing in this package imports grpc or `registry_service.presentation`, and its modules import
each other without a circle (`tests/unit/test_domain_imports.py`); the servicers in
`registry_service` translate.
"""
