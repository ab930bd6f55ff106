"""`python -m runtime_service [--config FILE] [--listen HOST:PORT]`: run the runtime until
SIGINT/SIGTERM. `add_arguments` and `run` also serve `codemode runtime`."""

from __future__ import annotations

import argparse

from codemode_common import service_main


def add_arguments(parser: argparse.ArgumentParser) -> None:
    service_main.add_arguments(parser, service="runtime", env_prefix="CODEMODE_RUNTIME_")


def run(args: argparse.Namespace, *, prog: str = "runtime") -> int:
    from runtime_service.config import ConfigError, RuntimeSettings, load_settings

    async def serve(settings: RuntimeSettings) -> bool:
        from runtime_service.server import serve  # imports grpc only once settings are valid

        return await serve(settings)

    return service_main.run(
        args,
        prog=prog,
        load_settings=load_settings,
        config_error=ConfigError,
        serve=serve,
        env_settings={"CODEMODE_RUNTIME_": RuntimeSettings},
    )


def main(argv: list[str] | None = None) -> int:
    return service_main.main(
        argv,
        module="runtime_service",
        description="Run the code runtime until SIGINT/SIGTERM.",
        add=add_arguments,
        run=run,
    )


if __name__ == "__main__":
    raise SystemExit(main())
