"""ULID-like ids: 48 bits of milliseconds and 80 bits of randomness, Crockford base32, 26 chars.

Ids made by one generator within the same millisecond increase monotonically, so they sort in
the order relay discovered the messages.
"""
import os
import threading

ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


_PAIRS = [a + b for a in ALPHABET for b in ALPHABET]   # 10 bits -> 2 characters


def _encode(value, length):
    """`length` (even) base32 characters of `value`, most significant first."""
    out = []
    for shift in range(5 * (length - 2), -1, -10):
        out.append(_PAIRS[(value >> shift) & 1023])
    return "".join(out)


def id_text(ms, rand, p=_PAIRS):
    """The id of (milliseconds, random part): `_encode(ms, 10) + _encode(rand, 16)`, unrolled
    (one id per message: the loops cost twice as much)."""
    return "".join([p[ms >> 40 & 1023], p[ms >> 30 & 1023], p[ms >> 20 & 1023], p[ms >> 10 & 1023], p[ms & 1023],
                    p[rand >> 70 & 1023], p[rand >> 60 & 1023], p[rand >> 50 & 1023], p[rand >> 40 & 1023],
                    p[rand >> 30 & 1023], p[rand >> 20 & 1023], p[rand >> 10 & 1023], p[rand & 1023]])


class IdGenerator:
    def __init__(self):
        self._lock = threading.Lock()
        self._last_ms = -1
        self._last_rand = 0

    def new(self, now):
        """An id for a message discovered at `now` (epoch seconds)."""
        ms = int(now * 1000)
        with self._lock:
            if ms <= self._last_ms:
                ms = self._last_ms
                rand = self._last_rand + 1
            else:
                rand = int.from_bytes(os.urandom(10), "big") >> 1  # room to increment
            self._last_ms, self._last_rand = ms, rand
        return id_text(ms, rand)



def id_time(mid):
    """The time (epoch seconds) an id was made at, from its first 10 characters."""
    ms = 0
    for c in mid[:10]:
        ms = ms * 32 + ALPHABET.index(c)
    return ms / 1000.0
