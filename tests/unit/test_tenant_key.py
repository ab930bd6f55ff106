"""The tenant key a run carries to the runtime (`RunStart.tenant`): the same for one agent and
principal, different for any other pair (a runtime keeps hosts per key: a collision would
share one between tenants), and naming neither."""

from __future__ import annotations

from registry_service.codemode.runtime_port import tenant_key


def test_one_tenant_one_key_and_no_two_tenants_share_one() -> None:
    pairs = [("a", "cert:x"), ("a", "cert:y"), ("b", "cert:x"), ("a\0cert:x", ""), ("", "")]
    keys = [tenant_key(agent, principal) for agent, principal in pairs]
    assert len(set(keys)) == len(pairs)
    assert tenant_key("a", "cert:x") == keys[0]
    assert all("cert" not in key and len(key) <= 64 for key in keys)
