"""A folder of the on-disk cache, read and written without ever following a link inside it.

The root (`~/.cache/xpuruntime`, `$XPURUNTIME_CACHE_DIR`, or a folder a caller names) may itself be a link:
users move caches around. Below it, each folder is opened relative to its parent's descriptor with
`O_NOFOLLOW`, and files are read through the checked opener (`files.py`) the same way. So a link planted
inside the cache, or a folder swapped for one, can lead no read, write or delete outside it: the
operation fails with a `FileError` instead.

Files are published atomically: written under a fresh temporary name (`O_EXCL`, never through a link),
flushed to disk (fsync), then renamed over the old name. A reader sees the old file or the new one, whole;
a writer killed midway leaves only a `.tmp` file that readers ignore and `remove_files` cleans.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import FileError
from ..files import NOFOLLOW, read_bytes

_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
TEMPORARY_SUFFIX = ".tmp"


class CacheFolder:
    """Files under `root`, named by path components (`("tuning", "matmul", "ab12.json")`)."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    def path(self, parts: Sequence[str]) -> Path:
        """Where `parts` lives (for messages: every access goes through the descriptors below)."""
        return self.root.joinpath(*parts)

    @contextlib.contextmanager
    def folder(self, parts: Sequence[str], create: bool = False) -> Iterator[int]:
        """A descriptor of the folder `parts` below the root, each component opened without following
        links; with `create`, missing folders (and the root) are made, readable by the owner only."""
        if create:
            os.makedirs(self.root, mode=0o700, exist_ok=True)
        fd = os.open(self.root, _DIR_FLAGS)
        try:
            for depth, name in enumerate(parts):
                _check_name(name)
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(name, 0o700, dir_fd=fd)
                try:
                    inner = os.open(name, _DIR_FLAGS | NOFOLLOW, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        shown = self.path(parts[: depth + 1])
                        raise FileError(
                            f"cache folder {shown} is a link or not a folder; the cache never follows links inside it"
                        ) from None
                    raise
                os.close(fd)
                fd = inner
            yield fd
        finally:
            os.close(fd)

    def read(self, parts: Sequence[str], what: str, limit: int | None) -> bytes | None:
        """The file's bytes, or None when it does not exist; FileError when it is a link, not a regular
        file, or larger than `limit`."""
        *folders, name = parts
        _check_name(name)
        try:
            with self.folder(folders) as fd:
                return read_bytes(name, what, limit=limit, follow=False, dir_fd=fd)
        except FileNotFoundError:
            return None
        except FileError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise FileError(str(exc).replace(f"'{name}'", f"'{self.path(parts)}'")) from None

    def write(self, parts: Sequence[str], data: bytes) -> None:
        """Publish `data` as the file `parts`: temporary name, fsync, rename (see the module docstring)."""
        *folders, name = parts
        _check_name(name)
        with self.folder(folders, create=True) as fd:
            temporary = f".{name}.{secrets.token_hex(6)}{TEMPORARY_SUFFIX}"
            out = os.open(temporary, _NEW_FILE_FLAGS, 0o600, dir_fd=fd)
            try:
                with os.fdopen(out, "wb") as file:
                    file.write(data)
                    file.flush()
                    os.fsync(file.fileno())
                os.replace(temporary, name, src_dir_fd=fd, dst_dir_fd=fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary, dir_fd=fd)
                raise
            with contextlib.suppress(OSError):
                os.fsync(fd)  # the rename itself reaches the disk

    def files(self, parts: Sequence[str] = (), suffixes: tuple[str, ...] = ("",), depth: int = 1) -> list:
        """(path components below `parts`, lstat result) of each regular file ending in one of `suffixes` in the
        folder `parts` and its subfolders down to `depth` levels; no link is followed, none is listed."""
        try:
            with self.folder(parts) as fd:
                return [(below, info) for _, below, info in _regular_files(fd, depth) if below[-1].endswith(suffixes)]
        except (FileNotFoundError, FileError):
            return []

    def remove(self, parts: Sequence[str]) -> bool:
        """Delete the file `parts` (a link itself, never what it points to); False when it was not there."""
        *folders, name = parts
        _check_name(name)
        try:
            with self.folder(folders) as fd:
                os.unlink(name, dir_fd=fd)
            return True
        except (FileNotFoundError, FileError):
            return False

    def remove_files(self, parts: Sequence[str] = (), suffixes: tuple[str, ...] = (), depth: int = 1) -> int:
        """Delete the regular files ending in one of `suffixes` (and stray temporary files) in the folder
        `parts` and its subfolders down to `depth` levels; links and special files are left alone, and no
        link is followed. Returns how many were deleted."""
        removed = 0
        try:
            with self.folder(parts) as fd:
                for folder_fd, below, _ in _regular_files(fd, depth):
                    if below[-1].endswith((*suffixes, TEMPORARY_SUFFIX)):
                        with contextlib.suppress(OSError):  # a link swapped in meanwhile: the link goes, not its target
                            os.unlink(below[-1], dir_fd=folder_fd)
                            removed += 1
        except (FileNotFoundError, FileError):
            pass
        return removed


def _regular_files(fd: int, depth: int, below: tuple[str, ...] = ()) -> Iterator[tuple[int, tuple[str, ...], Any]]:
    """(descriptor of its folder, path components, lstat) of each regular file in the folder `fd` and its
    subfolders down to `depth` levels, each subfolder opened without following links."""
    with os.scandir(fd) as found:
        for entry in found:
            try:
                if entry.is_dir(follow_symlinks=False) and depth > 0:
                    inner = os.open(entry.name, _DIR_FLAGS | NOFOLLOW, dir_fd=fd)
                    try:
                        yield from _regular_files(inner, depth - 1, (*below, entry.name))
                    finally:
                        os.close(inner)
                elif entry.is_file(follow_symlinks=False):
                    yield fd, (*below, entry.name), entry.stat(follow_symlinks=False)
            except OSError:  # changed under us (another process): skip it
                continue


def _check_name(name: str) -> None:
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\0" in name or os.sep in name:
        raise FileError(f"cache file name {name!r} is not a plain name")
