"""Codemode registry service: scopes, modes, the tool catalog and the policy pipeline."""
