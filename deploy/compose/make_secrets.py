"""Makes the compose stack's secrets once, into the `codemode-secrets` volume.

    python -m make_secrets DIR        (the `registry-secrets` service of compose.yaml)

Writes, unless they are there already (a restart keeps them, `docker compose down -v` drops
them together with the database):

- `DIR/postgres-password`: a random password, read by PostgreSQL (`POSTGRES_PASSWORD_FILE`)
  when it initialises its data directory; owned by the postgres image's uid, mode 0400.
- `DIR/registry.yaml`: the registries' settings file with the DSN holding that password and
  the shared parent-token key (`history_dsn`, `token_key`: every replica must accept the
  tokens the others mint); owned by the codemode image's uid, mode 0400.

Nothing secret is written into compose.yaml or the image. Run as root (to hand each file to
its reader's uid); as another user the files stay that user's (the tests).
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

# The uids the files are for: the postgres image's `postgres` user (compose runs it as
# 999:999) and the codemode image's user (Dockerfile `USER 10001:10001`).
POSTGRES_UID = 999
REGISTRY_UID = 10001
# Must match the postgres service of compose.yaml (POSTGRES_USER, POSTGRES_DB, its name).
DATABASE = "codemode"
ROLE = "codemode"
HOST = "postgres"
PORT = 5432


def make_secrets(directory: Path) -> bool:
    """Writes both files unless the password is there; True when it wrote them."""
    password_file = directory / "postgres-password"
    if password_file.exists():
        return False
    # Hex: safe in a URI without escaping.
    password = secrets.token_hex(24)
    settings = (
        "# Made once by make_secrets.py; the registries' --config (compose.yaml).\n"
        f"history_dsn: postgresql://{ROLE}:{password}@{HOST}:{PORT}/{DATABASE}\n"
        f"token_key: {secrets.token_hex(32)}\n"
    )
    # The password last: it marks the pair complete, so a run cut off in between starts over
    # (PostgreSQL waits for this service, so it has not used a password yet).
    _write(directory / "registry.yaml", settings, REGISTRY_UID)
    _write(password_file, password, POSTGRES_UID)
    return True


def _write(path: Path, text: str, uid: int) -> None:
    """Writes `path` whole (a reader never sees half of it), readable by `uid` only."""
    partial = path.with_name(f".{path.name}.partial")
    partial.unlink(missing_ok=True)
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(descriptor, "w") as stream:
        stream.write(text)
    if os.geteuid() == 0:
        os.chown(partial, uid, uid)
    os.replace(partial, path)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m make_secrets DIR", file=sys.stderr)
        return 2
    made = make_secrets(Path(argv[1]))
    print("secrets made" if made else "secrets kept", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
