"""The folder `pgkb ingest PATH` syncs, and nothing outside it.

:func:`discover` walks the folder for the files to ingest. A symlink to a file inside the folder is taken
under the link's own name; a symlink that resolves outside the folder -- to a file or to a directory -- is
refused: it is found with the reason (the ingest records it as a failure) and never opened. Symlinked
directories are not walked into (one inside the folder is walked under its own path anyway).

:func:`read_inside` opens a found file one path component at a time from the folder, following no
symlink on the way (``O_NOFOLLOW`` on every component), so a file or a directory swapped for a link
between the walk and the read yields an error, never bytes from outside the folder.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import stat
import unicodedata
from dataclasses import dataclass
from pathlib import Path

__all__ = ["OUTSIDE", "FolderError", "Found", "TooLarge", "discover", "read_inside"]

#: The reason recorded for a symlink that leads out of the folder (its target is not named: that is not
#: the knowledge base's to know).
OUTSIDE = "a symlink that resolves outside the ingested folder: not read"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class FolderError(Exception):
    """A found file cannot be read as found; the message is the reason."""


class TooLarge(FolderError):
    """The file is larger than the caller reads; ``size`` in bytes."""

    def __init__(self, size: int) -> None:
        super().__init__(f"{size} bytes")
        self.size = size


@dataclass(frozen=True)
class Found:
    """One entry of the folder ``root``: ``path`` as found (a symlink's own path) and ``parts``, the path of
    the regular file to read relative to ``root`` (a symlink's resolved target); or, with ``refused``, the
    reason it is not read (``parts`` is empty then)."""

    doc_key: str  # the path relative to the root, in NFC (a decomposed macOS name is the same key)
    path: Path
    root: Path
    parts: tuple[str, ...]
    refused: str | None = None


def _matches(rel: str, name: str, globs: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(name, g) or fnmatch.fnmatch(rel, g) for g in globs)


def discover(root: Path, include: tuple[str, ...], exclude: tuple[str, ...]) -> list[Found]:
    """Every file under ``root`` matching an include glob and no exclude glob, and every symlink out of
    ``root`` that is not excluded and leads to a directory or matches an include glob (refused), sorted by
    path. Globs match the file name or the relative path; an exclude glob matching a directory prunes it.
    Directories that cannot be listed are skipped."""
    root = root.resolve()
    found: list[tuple[list[str], Found]] = []

    def add(parts: list[str], target: tuple[str, ...], refused: str | None = None) -> None:
        key = unicodedata.normalize("NFC", "/".join(parts))
        found.append((parts, Found(key, root.joinpath(*parts), root, target, refused)))

    def walk(fd: int, parents: list[str]) -> None:
        with os.scandir(fd) as listing:
            entries = list(listing)
        for entry in entries:
            parts = [*parents, entry.name]
            rel = "/".join(parts)
            if _matches(rel, entry.name, exclude):
                continue
            if entry.is_symlink():
                try:
                    target = root.joinpath(*parts).resolve()
                except (OSError, RuntimeError):  # a symlink loop leads nowhere: nothing to ingest
                    continue
                if not target.is_relative_to(root):
                    if target.is_dir() or _matches(rel, entry.name, include):
                        add(parts, (), OUTSIDE)
                elif target.is_file() and _matches(rel, entry.name, include):
                    add(parts, target.relative_to(root).parts)
            elif entry.is_dir(follow_symlinks=False):
                try:
                    sub = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
                except OSError:  # gone, unreadable, or swapped for a link since it was listed
                    continue
                try:
                    walk(sub, parts)
                finally:
                    os.close(sub)
            elif entry.is_file(follow_symlinks=False) and _matches(rel, entry.name, include):
                add(parts, tuple(parts))

    top = os.open(root, _DIR_FLAGS)
    try:
        walk(top, [])
    finally:
        os.close(top)
    return [f for _, f in sorted(found, key=lambda item: item[0])]


def read_inside(root: Path, parts: tuple[str, ...], max_bytes: int) -> bytes:
    """The bytes of the regular file ``root/parts...`` (at most ``max_bytes``: TooLarge beyond), opened one
    component at a time from ``root`` without following a symlink. FolderError when it is no regular file
    or a component of its path is a symlink (swapped since the walk); OSError when it cannot be read."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for name in parts[:-1]:
            sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = sub
        file_fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise FolderError("its path was changed into a symlink while the folder was read: not read") from e
        raise
    finally:
        os.close(fd)
    with os.fdopen(file_fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise FolderError("not a regular file any more: not read")
        data = fh.read(max_bytes + 1) if st.st_size <= max_bytes else b""
    if max(st.st_size, len(data)) > max_bytes:
        raise TooLarge(max(st.st_size, len(data)))
    return data
