"""A small filesystem of the test's own (a tmpfs it mounts) that can be filled to the last byte
and freed again: a real full disk, not a simulated one."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


class SmallDisk:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._filler = root / "filler"

    def fill(self) -> None:
        """Writes a file until the filesystem has no byte left."""
        with self._filler.open("ab", buffering=0) as out:
            for chunk in (1 << 16, 1 << 12, 1 << 9, 1):
                block = b"\0" * chunk
                try:
                    while True:
                        out.write(block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
        assert os.statvfs(self.root).f_bavail == 0

    def free(self) -> None:
        self._filler.unlink(missing_ok=True)


@contextlib.contextmanager
def small_disk(where: Path, size: str = "8m") -> Iterator[SmallDisk | str]:
    """A tmpfs of `size` mounted at `where` for the block, or, when this process cannot mount
    one (not root, or no CAP_SYS_ADMIN in this container), why not (`where` is then a plain
    directory)."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        yield f"cannot mount a tmpfs for a full-disk test: {mounted.stderr.strip()}"
        return
    try:
        yield SmallDisk(where)
    finally:
        # Lazy: a store the test failed to close must not leave the mount behind.
        subprocess.run(["umount", "-l", str(where)], check=False)


def require(disk: SmallDisk | str) -> SmallDisk:
    if isinstance(disk, str):
        pytest.skip(disk)
    return disk
