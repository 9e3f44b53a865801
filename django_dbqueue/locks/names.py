"""What every backend shares to turn lock and counter names into its keys.

Two rules keep distinct names apart on every backend (see docs/locks.md, "Lock names"):

- Whatever a key stands for is encoded unambiguously before it is hashed. A name is its
  UTF-8 bytes; anything that is not a user's name (a semaphore slot, a fencing counter)
  starts with the byte 0xFF, which UTF-8 never produces, so no name can reach it.
- A key that keeps part of a name for people to read also carries the digest of the whole
  encoding; the readable part never decides which lock or row it is.
"""

from __future__ import annotations

import hashlib
import re

#: The first byte of every encoding that is not a plain name: never part of UTF-8.
TAG = b"\xff"

# Characters that mean the same to every server, collation and log viewer.
UNREADABLE = re.compile(r"[^A-Za-z0-9_.:-]")


def encode(text: str) -> bytes:
    # surrogatepass: a str with lone surrogates (os.fsdecode of a file name, say) is still
    # a valid name, and the encoding stays one-to-one.
    return text.encode("utf-8", "surrogatepass")


def lock_digest(full_name: str, slot: int | None) -> bytes:
    """SHA-256 of the lock ``full_name`` (a mutex) or of slot ``slot`` of that semaphore."""
    if slot is None:
        return hashlib.sha256(encode(full_name)).digest()
    return hashlib.sha256(TAG + b"slot:%d:" % slot + encode(full_name)).digest()


def tagged_digest(kind: str, name: str) -> str:
    """Hex SHA-256 of ``name`` in the private namespace ``kind``."""
    return hashlib.sha256(TAG + encode(kind) + b":" + encode(name)).hexdigest()


def readable(text: str, max_chars: int) -> str:
    """An ASCII hint of ``text`` for whoever reads the server's lock list or table."""
    return UNREADABLE.sub("_", text)[:max_chars]
