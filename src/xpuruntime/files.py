"""The one checked opener: every file xpuruntime reads (policy files, tuning-cache entries, the native
extension, `xpuruntime run --inputs`) is opened here.

- Only a regular file, or a link to one, is opened. A FIFO, a socket, a device such as /dev/zero or a folder
  is refused before anything opens it, so a read can neither block forever nor run until memory is gone.
- The file is opened non-blocking and checked again on the open descriptor, so a file swapped for a FIFO
  between the check and the open is refused too.
- `limit` caps the bytes read: a policy or cache file larger than its kind allows is refused unread.
- `follow=False` refuses a link as the last component (`O_NOFOLLOW`), and `dir_fd` opens the name relative
  to a folder that is already open: together they read inside the cache folder without following links
  (see `runtime/cache_folder.py`).

Refusals raise `FileError` (an `OSError` and an `XpuRuntimeError`) naming what was read and why.
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

from .errors import FileError

_NOT_REGULAR = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a folder",
    stat.S_IFLNK: "a symbolic link",
}
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


def kind_of(mode: int) -> str:
    """'a regular file', 'a FIFO (named pipe)', 'a folder', ... for an `st_mode`."""
    return "a regular file" if stat.S_ISREG(mode) else _NOT_REGULAR.get(stat.S_IFMT(mode), "a special file")


def cannot_read(what: str, shown: str, exc: OSError) -> FileError:
    """A FileError for an OSError, keeping its errno (`errno.ENOENT`: the file is missing)."""
    error = FileError(f"cannot read {what} '{shown}': {exc.strerror or exc}")
    error.errno = exc.errno
    return error


def open_fd(path: str | os.PathLike, what: str, *, follow: bool = True, dir_fd: int | None = None) -> int:
    """A read-only descriptor of `path`, which must be a regular file (or, with follow=True, a link to one)."""
    shown = os.fspath(path)
    try:
        before = os.stat(path, dir_fd=dir_fd, follow_symlinks=follow)
    except OSError as exc:
        raise cannot_read(what, shown, exc) from None
    if not stat.S_ISREG(before.st_mode):
        raise FileError(f"cannot read {what} '{shown}': it is {kind_of(before.st_mode)}, not a regular file")
    try:
        fd = os.open(path, _READ_FLAGS | (0 if follow else NOFOLLOW), dir_fd=dir_fd)
    except OSError as exc:
        raise cannot_read(what, shown, exc) from None
    after = os.fstat(fd)
    if not stat.S_ISREG(after.st_mode):  # swapped between the stat and the open
        os.close(fd)
        raise FileError(f"cannot read {what} '{shown}': it is {kind_of(after.st_mode)}, not a regular file")
    return fd


def read_bytes(
    path: str | os.PathLike, what: str, *, limit: int | None = None, follow: bool = True, dir_fd: int | None = None
) -> bytes:
    """The whole content of a regular file, refused unread when larger than `limit` bytes."""
    fd = open_fd(path, what, follow=follow, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as file:
        size = os.fstat(fd).st_size
        if limit is not None and size > limit:
            raise FileError(f"{what} '{os.fspath(path)}' is {size} bytes; a {what} is at most {limit} bytes")
        try:
            data = file.read(-1 if limit is None else limit + 1)
        except OSError as exc:
            raise cannot_read(what, os.fspath(path), exc) from None
    if limit is not None and len(data) > limit:  # it grew while being read
        raise FileError(f"{what} '{os.fspath(path)}' is over {limit} bytes; a {what} is at most {limit} bytes")
    return data


def open_binary(path: str | os.PathLike, what: str) -> BinaryIO:
    """A regular file (or a link to one) opened for binary reading (for readers that take a file object)."""
    return os.fdopen(open_fd(path, what), "rb")
