"""What a long-running rsgw process asks of the operating system for itself.

Two habits of busy servers, kept in one place: take the hard limit on open files
as the soft one (every connection and shared memory region holds a descriptor),
and hand freed heap memory back to the kernel (glibc keeps the heap it grew for a
burst of large messages, so RSS would stay at the burst's high-water mark).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import resource
from collections.abc import Callable

#: The highest descriptor limit we ask for when the hard limit is unlimited.
_MAX_OPEN_FILES = 1 << 20


def raise_open_file_limit() -> None:
    """Take the hard limit on open files as our soft one, as Go servers do.

    The usual soft limit (1024) is a few hundred clients. Where even the hard limit
    runs out, the listeners wait and retry, and registrations are refused.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = _MAX_OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, _MAX_OPEN_FILES)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return trim


_TRIM = _malloc_trim()


def give_back_memory() -> None:
    """Return the heap's free pages to the kernel (glibc's malloc_trim; else nothing).

    About 0.1 ms after a burst of large messages, microseconds otherwise.
    """
    if _TRIM is not None:
        _TRIM(0)
