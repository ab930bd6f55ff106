"""`python -m registry_service [--config FILE] [--listen HOST:PORT]`: run the registry until
SIGINT/SIGTERM. `add_arguments` and `run` also serve `codemode registry`."""

from __future__ import annotations

import argparse

from codemode_common import service_main


def add_arguments(parser: argparse.ArgumentParser) -> None:
    service_main.add_arguments(parser, service="registry", env_prefix="CODEMODE_REGISTRY_")


def run(args: argparse.Namespace, *, prog: str = "registry") -> int:
    from registry_service.config import ConfigError, RegistrySettings, load_settings

    async def serve(settings: RegistrySettings) -> bool:
        from registry_service.server import serve  # grpc and telemetry: only when serving

        return await serve(settings)

    return service_main.run(
        args,
        prog=prog,
        load_settings=load_settings,
        config_error=ConfigError,
        serve=serve,
        env_settings={"CODEMODE_REGISTRY_": RegistrySettings},
    )


def main(argv: list[str] | None = None) -> int:
    return service_main.main(
        argv,
        module="registry_service",
        description="Run the registry until SIGINT/SIGTERM.",
        add=add_arguments,
        run=run,
    )


if __name__ == "__main__":
    raise SystemExit(main())
