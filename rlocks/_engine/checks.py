"""Argument validation, done before any Redis call.

Each check raises exactly the exception ``threading`` raises for the same mistake
(``TypeError``, ``ValueError``, ``OverflowError``), with a message that names the primitive,
so a bad argument never reaches Redis and never changes anything there.
"""

from __future__ import annotations

import codecs
import math
import numbers
from _thread import TIMEOUT_MAX
from typing import Iterable, Mapping, Optional, Tuple

__all__ = [
    "NAME_MAX",
    "TIMEOUT_MAX",
    "check_name",
    "check_namespace",
    "check_ttl",
    "check_wire_names",
    "lock_wait",
    "replication",
    "semaphore_wait",
    "shown",
]

# Redis keeps PEXPIRE in signed 64-bit milliseconds; a lease past ~292 million years would
# overflow it. Any lease that long is a mistake, so it is refused up front.
_TTL_MAX = 2.0**62 / 1000.0


#: The longest name (and namespace) a primitive may have, in UTF-8 bytes: a Redis key
#: holds it, and every repr and error names it (shortened: :func:`shown`).
NAME_MAX = 1024
#: How much of a long name reprs and errors show.
SHOWN_MAX = 200


def shown(name: object) -> str:
    """``repr(name)``, shortened to about :data:`SHOWN_MAX` characters for a long name (the
    length is said): what reprs and error messages print of a name."""
    text = repr(name)
    if len(text) <= SHOWN_MAX:
        return text
    size = len(name) if isinstance(name, str) else len(text)
    return f"{text[:SHOWN_MAX - 1]}…' ({size} characters)"


def _label(kind: str, name: object) -> str:
    return f"{kind}({shown(name)})"


def _text(value: object, what: str, where: str) -> str:
    """A non-empty ``str`` that encodes to UTF-8 (Redis keys travel as UTF-8)."""
    if not isinstance(value, str):
        raise TypeError(f"{where} {what} must be a str, not {type(value).__name__}")
    if not value:
        raise ValueError(f"{where} {what} must not be empty")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ValueError(f"{where} {what} {shown(value)} is not valid unicode: "
                         f"{exc.reason}") from None
    if size > NAME_MAX:
        raise ValueError(f"{where} {what} {shown(value)} is {size} bytes (UTF-8); at most "
                         f"{NAME_MAX} are allowed")
    return value


def check_name(name: object, kind: str) -> str:
    """A primitive's name: a non-empty ``str`` that encodes to UTF-8."""
    return _text(name, "name", kind)


def check_namespace(namespace: object, kind: str, name: str) -> str:
    """A key namespace: a non-empty ``str`` that encodes to UTF-8."""
    return _text(namespace, "namespace", _label(kind, name) + ":")


def check_wire_names(values: Mapping[str, str], encodings: Iterable[str], label: str) -> None:
    """Refuse ``values`` (what each is, e.g. ``"name"``, -> the text) that a client of one
    of ``encodings`` cannot send as the same bytes in every process: a non-ASCII one when
    the encoding is not UTF-8, and any at all when the encoding changes ASCII text (UTF-16,
    EBCDIC: rlocks' keys, ids and arguments are ASCII). ValueError naming the encoding;
    no I/O.

    Why: redis-py sends a str argument in the client's ``encoding`` with its own packer,
    but as UTF-8 whatever the encoding when hiredis is installed (its ``pack_command``; the
    asyncio client never uses it). So a latin-1 client names ``b"caf\xe9"`` in one process
    and ``b"caf\xc3\xa9"`` in another that has hiredis: two keys, both holders at once.
    ASCII text is the same bytes either way, and so is anything a UTF-8 client sends.
    """
    for encoding in encodings:
        try:
            codec = codecs.lookup(encoding).name
            keeps_ascii = _ASCII_PROBE.encode(encoding) == _ASCII_PROBE.encode("ascii")
        except LookupError:
            continue  # redis-py itself cannot encode with it: its first command says so
        if codec == "utf-8":
            continue
        if not keeps_ascii:
            raise ValueError(
                f"{label}: the client's encoding {encoding!r} does not send ASCII text as "
                "ASCII, which rlocks' keys and arguments are: use a UTF-8 client "
                "(redis-py's default encoding)"
            )
        for what, value in values.items():
            if not value.isascii():
                raise ValueError(
                    f"{label}: the {what} {value!r} is not ASCII and the client's encoding "
                    f"is {encoding!r}: redis-py sends it in that encoding, but as UTF-8 "
                    "when hiredis is installed, so processes with and without hiredis "
                    "would use different keys for one lock. Use an ASCII name or a "
                    "UTF-8 client (redis-py's default encoding)"
                )


#: Every ASCII character a key or an argument of rlocks may carry, and then some.
_ASCII_PROBE = "".join(chr(c) for c in range(32, 127))


def _real(value: object, what: str, label: str) -> float:
    # bool is an int, and threading accepts True as a timeout of 1 s; so do we.
    if not isinstance(value, numbers.Real):
        raise TypeError(f"{label}: {what} must be a number, not {type(value).__name__}")
    result = float(value)
    if math.isnan(result):
        raise ValueError(f"{label}: {what} must be a number, not NaN")
    return result


def check_ttl(ttl: object, kind: str, name: str) -> int:
    """The lease length in seconds; returns it in whole milliseconds (at least 1)."""
    label = _label(kind, name)
    if isinstance(ttl, bool):
        raise TypeError(f"{label}: ttl must be a number of seconds, not bool")
    seconds = _real(ttl, "ttl", label)
    if not (0.0 < seconds <= _TTL_MAX):
        raise ValueError(
            f"{label}: ttl must be a positive, finite number of seconds, got {ttl!r}"
        )
    if seconds < 0.001:
        raise ValueError(f"{label}: ttl must be at least 0.001 s (1 ms), got {ttl!r}")
    return max(1, round(seconds * 1000.0))


def lock_wait(blocking: object, timeout: object, kind: str, name: str) -> Optional[float]:
    """``threading.Lock.acquire`` arguments -> seconds to wait (``None``: forever, 0: try once).

    Same rules and exception types as ``_thread.RLock.acquire``: a timeout with
    ``blocking=False`` is a ValueError, so is a negative timeout other than -1 and NaN;
    above ``threading.TIMEOUT_MAX`` (or infinite) it is an OverflowError.
    """
    label = _label(kind, name)
    seconds = _real(timeout, "timeout", label)
    if not blocking:
        if seconds != -1:
            raise ValueError(f"{label}: can't specify a timeout for a non-blocking call")
        return 0.0
    if seconds == -1:
        return None
    if seconds < 0:
        raise ValueError(
            f"{label}: timeout must be a non-negative number or -1, got {timeout!r}"
        )
    if seconds > TIMEOUT_MAX:
        raise OverflowError(f"{label}: timeout {timeout!r} is above threading.TIMEOUT_MAX")
    return seconds


def semaphore_wait(
    blocking: object, timeout: object, kind: str, name: str
) -> Optional[float]:
    """``threading.Semaphore.acquire`` arguments -> seconds to wait (``None``: forever).

    Same rules as ``threading.Semaphore``: ``timeout=None`` waits forever, a timeout with
    ``blocking=False`` is a ValueError, and a negative timeout means "try once". NaN is
    refused (threading would treat it as "forever" by accident).
    """
    label = _label(kind, name)
    if not blocking:
        if timeout is not None:
            raise ValueError(f"{label}: can't specify timeout for non-blocking acquire")
        return 0.0
    if timeout is None:
        return None
    seconds = _real(timeout, "timeout", label)
    if seconds > TIMEOUT_MAX:
        raise OverflowError(f"{label}: timeout {timeout!r} is above threading.TIMEOUT_MAX")
    return max(0.0, seconds)


def replication(
    replicas: object, replica_wait: object, kind: str, name: str
) -> Optional[Tuple[int, int]]:
    """``replicas`` / ``replica_wait`` -> the WAIT arguments ``(replicas, ms)``, or None."""
    label = _label(kind, name)
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise TypeError(f"{label}: replicas must be an int, not {type(replicas).__name__}")
    if replicas < 0:
        raise ValueError(f"{label}: replicas must be >= 0, got {replicas}")
    seconds = _real(replica_wait, "replica_wait", label)
    if not (0.0 < seconds < math.inf):
        raise ValueError(
            f"{label}: replica_wait must be a positive, finite number of seconds, "
            f"got {replica_wait!r}"
        )
    if replicas == 0:
        return None
    return replicas, max(1, round(seconds * 1000.0))


def deadlock_timeout(value: object, kind: str, name: str) -> Optional[float]:
    """``deadlock_timeout``: seconds of waiting before deadlock checks begin (``None``: off)."""
    if value is None:
        return None
    label = _label(kind, name)
    if isinstance(value, bool):
        raise TypeError(f"{label}: deadlock_timeout must be a number of seconds or None, not bool")
    seconds = _real(value, "deadlock_timeout", label)
    if not (0.0 < seconds <= 1e9):  # the edge's lease (ms) must stay an integer Redis takes
        raise ValueError(
            f"{label}: deadlock_timeout must be a positive, finite number of seconds or "
            f"None, got {value!r}"
        )
    return seconds


def entry_lease(value: object, kind: str, name: str) -> int:
    """``entry_lease``: seconds a queue entry lives without renewal (so a dead waiter
    holds up the queue at most this long); returns it in whole milliseconds."""
    label = _label(kind, name)
    if isinstance(value, bool):
        raise TypeError(f"{label}: entry_lease must be a number of seconds, not bool")
    seconds = _real(value, "entry_lease", label)
    # Renewed every third of it: below 10 ms a renewal could not keep up with its lease.
    if not (0.01 <= seconds <= _TTL_MAX):
        raise ValueError(
            f"{label}: entry_lease must be a finite number of seconds >= 0.01, got {value!r}"
        )
    return round(seconds * 1000.0)
