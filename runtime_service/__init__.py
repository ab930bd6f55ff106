"""Codemode runtime service. Kept empty of imports: workers import this package under ``-I -S``."""
