"""Model-facing presentation: the `run_code` wire schema and the generated tool SDK texts.

Pure functions over plain data (no gRPC, no registry state): `run_code_schema` builds the
reserved transport's schema per runtime language, `sdk_typescript` / `sdk_python` render the
`tools:sdk` prompt section from `sdk_model.SdkTool` rows.
"""
