"""Model-facing presentation: the `run_code` wire schema and the generated tool SDK texts.

Pure functions over plain data (no gRPC, no registry state): `language_profiles` holds one
profile per program language (its SDK renderer, `run_code` flavour, Cordis Host-half guidance
and host façade), `run_code_schema` builds the reserved transport's schema in a language's
flavour, `sdk_typescript` / `sdk_python` render the `tools:sdk` prompt section from
`sdk_model.SdkTool` rows, and `assembly` puts a scope's wire schemas and prompt together.
"""
