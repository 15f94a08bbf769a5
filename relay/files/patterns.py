"""The paths and globs of file reservations: how one is written down (normalised relative to the
project root, never outside it) and whether two overlap.

The rule. A reservation is a path or a glob, relative to the project root, '/'-separated. In a
glob, `*` is any run of characters within one name, `?` one character, `[abc]`, `[a-z]`, `[!a]`
/ `[^a]` one character of (not of) a set, and `**` as a whole segment any number of whole
segments, none included (`**` inside a segment is `*`). A plain path (no glob character) holds
itself and everything under it (`src` holds `src/app.py`; `.` the whole project), unless it
names a file that exists when it is reserved (not a directory: a regular file, a link): then
only that file (scope "file"; "tree" otherwise). A glob holds exactly the paths it matches:
`src/*.py` the .py files directly in src/, `src/**` everything under src/, `src/*` the entries
of src/ but not what is under them (write `src/*/**` or `src/**` for that). Two reservations
overlap when some path is held by both, decided exactly (the two are intersected as regular
languages, segment by segment and character by character, by dynamic programming over the two
without recursion: time O(len(a) * len(b))): `src` overlaps `src/app.py` and
`**/*.md` (src/x.md); `src/*.py` overlaps `src/a*` (src/a.py) but not `src/*.md` or
`src/lib/x.py`; `**/*.py` never overlaps `**/*.md`; `[!a]*` never overlaps `a*`; `src/app.py`, a
file, does not overlap `**/*.md`, but `src/new.py`, not there yet, does (src/new.py/x.md: it may
become a directory).

The bound. Deciding one request (its paths against every lease another agent holds) may take at
most MAX_WORK steps (a `Work`: a row of one dynamic programme, or two segments looked up);
past it TooMuchWork refuses the request whole, so that a request of long many-segment globs
against many such leases costs seconds of its own process, not hours.

The limits. Paths are compared as written, not as the file system resolves them: a symbolic
link, a hard link or a case-insensitive file system can give one file two paths, and relay sees
two. `..` is taken lexically. Glob characters cannot be escaped: a name holding `*`, `?` or a
`[...]` makes a glob (reserve its directory instead). `*` and `?` match a leading dot. Matching
is case-sensitive. Whether a name a glob matches is a file or a directory is not asked: a glob
holds the name, not what may be under it. A file reserved as a file that is later replaced by a
directory stays held as one path.
"""
import functools
import os
import re
import stat
from pathlib import Path, PurePosixPath

from relay.errors import RelayError
from relay.terminal import unsafe

MAX_PATTERN = 1024          # characters of one path or glob
MAX_WORK = 1_000_000        # steps one request's overlaps may take (at most a few seconds)
GLOBSTAR = "**"
STAR = ("*",)
_SLASH = 0x2F
_TOP = 0x10FFFF
_ANY = ((0, _SLASH - 1), (_SLASH + 1, _TOP))    # every character a name may hold
_STARS = re.compile(r"\*{2,}")                   # inside a segment, a run of stars is one


class PatternError(RelayError):
    """A path or glob that cannot be reserved (outside the project, matching nothing)."""


class TooMuchWork(RelayError):
    """Deciding the overlaps of one request would take more than its Work's limit of steps."""

    def __init__(self, limit):
        super().__init__(f"deciding this request would take more than {limit:,} steps of comparing its paths with "
                         "the leases held (the bound of one request): reserve fewer or shorter paths at a time")
        self.limit = limit


class Work:
    """The steps deciding overlaps may take, counted in `spent` up to `limit` (past it:
    TooMuchWork). A step is a row of a dynamic programme over a few machine words, or two
    segments looked up; two segments are compared once per Work."""

    def __init__(self, limit=MAX_WORK):
        self.limit, self.spent, self._known = limit, 0, {}

    def spend(self, steps):
        self.spent += steps
        if self.spent > self.limit:
            raise TooMuchWork(self.limit)

    def meets(self, t, u):
        """_meets(t, u), counted."""
        self.spend(1)
        key = (t, u)
        if key not in self._known:
            self.spend(_segment_steps(t, u))
            self._known[key] = _meets(t, u)
        return self._known[key]


def _steps(m, n):
    """The steps of _meet over m tokens and n: a row per token of one (each a few operations on
    an integer of n + 1 bits), and the other's masks made once."""
    return m * (1 + n // 64) + n + 1


def _segment_steps(t, u):
    """The steps of _meets(t, u): _meet's, and a mask per distinct token of t (a character looked
    up and intersected with u's sets; a set intersected with every token of u)."""
    distinct = set(t) - {STAR}
    sets = sum(1 for x in u if x is not STAR and not (len(x) == 1 and x[0][0] == x[0][1]))
    wide = sum(1 for x in distinct if not (len(x) == 1 and x[0][0] == x[0][1]))
    return _steps(len(t), len(u)) + len(distinct) * sets + wide * len(u)


def normalise(text, root, base=None):
    """`text` (a path or glob) as a reservation stores it: relative to the project `root`,
    '/'-separated, without '.', '..', empty segments or a trailing '/'; '.' for the root
    itself. A relative path is taken from `base` (the caller's current directory) when given,
    else from the root. PatternError when it is empty, too long, holds a control character,
    leads outside the root or can match nothing."""
    if not isinstance(text, str) or not text.strip():
        raise PatternError("an empty path: name a file, a directory or a glob (relative to the project)")
    if len(text) > MAX_PATTERN:
        raise PatternError(f"a path of {len(text)} characters; at most {MAX_PATTERN}")
    if any(unsafe(c) or 0xD800 <= ord(c) < 0xE000 for c in text):
        raise PatternError(f"{text!r} holds a control character or bytes that are not UTF-8")
    path = PurePosixPath(text)
    if not path.is_absolute() and base is not None:
        path = PurePosixPath(os.path.abspath(base)) / path
    parts = _inside(path, Path(root)) if path.is_absolute() else list(path.parts)
    if parts is None:
        raise PatternError(f"{text} is outside the project ({root}): reservations name its files")
    out = []
    for part in parts:
        if part in ("", "."):
            continue
        if part == "..":
            if not out:
                raise PatternError(f"{text} leads outside the project ({root}): reservations name its files")
            out.pop()
            continue
        out.append(GLOBSTAR if part == GLOBSTAR else _STARS.sub("*", part))
    pattern = "/".join(out) or "."
    if any(not _meets(s, s) for s in _segments(pattern) if s is not GLOBSTAR):
        raise PatternError(f"{text} matches no name (an empty character set)")
    return pattern


def _inside(path, root):
    """The parts of absolute `path` below `root` (as named, or resolved), or None."""
    for r in dict.fromkeys([PurePosixPath(os.path.abspath(root)), PurePosixPath(os.path.realpath(root))]):
        try:
            return list(path.relative_to(r).parts)
        except ValueError:
            continue
    return None


def scope(pattern, root):
    """What a normalised pattern holds: "glob" (what it matches), "file" (a plain path naming
    an existing entry of the project that is not a directory: itself) or "tree" (itself and
    everything under it: a directory, or a path not there yet)."""
    if is_glob(pattern):
        return "glob"
    try:
        st = os.lstat(os.path.join(root, pattern))
    except (OSError, ValueError):
        return "tree"
    return "tree" if stat.S_ISDIR(st.st_mode) else "file"


def overlap(a, b, a_scope=None, b_scope=None, work=None):
    """Whether some path is held by both reservations `a` and `b` (normalised patterns, with
    their scopes; a plain path without one is a "tree"), its steps counted in `work` (a Work)
    when given."""
    return _sequences_meet(_held(a, a_scope), _held(b, b_scope), work)


def covers(pattern, path, scope_=None):
    """Whether the reservation `pattern` (of scope `scope_`) holds the file at `path`
    (relative, normalised; taken literally: its glob characters are characters)."""
    return _sequences_meet(_held(pattern, scope_),
                           tuple(tuple(((ord(c), ord(c)),) for c in s) for s in path.split("/") if s))


@functools.lru_cache(maxsize=4096)
def _held(pattern, scope_=None):
    """The segments of what a reservation holds: a glob's own; a file's; a tree's, `**` after."""
    segs = _segments(pattern)
    return segs if is_glob(pattern) or scope_ == "file" else segs + (GLOBSTAR,)


@functools.lru_cache(maxsize=4096)
def is_glob(pattern):
    """Whether a pattern holds a glob character: `*`, `?`, or a `[` that opens a set."""
    if "*" in pattern or "?" in pattern:
        return True
    return any(_class_end(seg, i) is not None for seg in pattern.split("/") for i, c in enumerate(seg) if c == "[")


@functools.lru_cache(maxsize=4096)
def _segments(pattern):
    """A pattern as segments: GLOBSTAR, or a tuple of tokens (STAR, or a set of characters)."""
    if pattern == ".":
        return ()
    return tuple(GLOBSTAR if s == GLOBSTAR else _tokens(s) for s in pattern.split("/"))


def _tokens(seg):
    """One segment's tokens: STAR, or a character set as merged (low, high) ranges."""
    out, i = [], 0
    while i < len(seg):
        c = seg[i]
        if c == "*":
            if not out or out[-1] is not STAR:
                out.append(STAR)
        elif c == "?":
            out.append(_ANY)
        elif c == "[" and (end := _class_end(seg, i)) is not None:
            out.append(_char_class(seg[i + 1:end]))
            i = end
        else:
            out.append(((ord(c), ord(c)),))
        i += 1
    return tuple(out)


def _class_end(seg, i):
    """The index of the ']' closing the set opened at seg[i], or None (then '[' is itself)."""
    j = i + 1
    if j < len(seg) and seg[j] in "!^":
        j += 1
    if j < len(seg) and seg[j] == "]":      # a ']' first in the set is one of its characters
        j += 1
    end = seg.find("]", j)
    return None if end < 0 else end


def _char_class(body):
    negate = body[:1] in ("!", "^")
    if negate:
        body = body[1:]
    ranges, i = [], 0
    while i < len(body):
        if i + 2 < len(body) and body[i + 1] == "-":
            ranges.append((ord(body[i]), ord(body[i + 2])))
            i += 3
        else:
            ranges.append((ord(body[i]), ord(body[i])))
            i += 1
    ranges = _merge([r for r in ranges if r[0] <= r[1]])
    return _intersect(_complement(ranges) if negate else ranges, _ANY)


def _merge(ranges):
    out = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def _complement(ranges):
    out, low = [], 0
    for lo, hi in ranges:
        if lo > low:
            out.append((low, lo - 1))
        low = hi + 1
    if low <= _TOP:
        out.append((low, _TOP))
    return tuple(out)


def _intersect(a, b):
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


@functools.lru_cache(maxsize=65536)
def _meets(a, b):
    """Whether two segments' tokens match a common name (two segments of stars alone meet on any
    name; otherwise a common match holds a character)."""
    return _meet(a, b, STAR, _char_masks(b))


def _char_masks(b):
    """For a token of one segment, the bits j of the tokens b[j] (not STAR) sharing a character
    with it: b's single characters looked up, its sets intersected."""
    single, sets = {}, []
    for j, u in enumerate(b):
        if u is STAR:
            continue
        if len(u) == 1 and u[0][0] == u[0][1]:
            single[u[0][0]] = single.get(u[0][0], 0) | 1 << j
        else:
            sets.append((j, u))

    def masks(t):
        if len(t) == 1 and t[0][0] == t[0][1]:
            bits = single.get(t[0][0], 0)
        else:
            bits = sum(m for c, m in single.items() if _intersect(t, ((c, c),)))
        return bits | sum(1 << j for j, u in sets if _intersect(t, u))
    return masks


def _sequences_meet(a, b, work=None):
    """Whether two sequences of segments match a common path (GLOBSTAR: any whole segments)."""
    a, b = _one_globstar(a), _one_globstar(b)
    meets = _meets
    if work is not None:
        work.spend(_steps(len(a), len(b)))
        meets = work.meets
    return _meet(a, b, GLOBSTAR, lambda t: sum(1 << j for j, u in enumerate(b) if u is not GLOBSTAR and meets(t, u)))


def _one_globstar(segs):
    """`**/**` is `**`: a run of them as one (as a run of stars in a segment is one STAR)."""
    return tuple(s for k, s in enumerate(segs) if not (s is GLOBSTAR and k and segs[k - 1] is GLOBSTAR))


def _meet(a, b, star, masks):
    """Whether the token sequences `a` and `b` match a common string, where `star` (never two in
    a row) matches any run of items and another token of `a` matches one item together with the
    tokens b[j] whose bits are in `masks(token)`. Dynamic programming over the two, a row per
    token of `a`: bit j of `row` says that a[:i] and b[:j] match a common prefix. No recursion;
    time O(len(a) * len(b)): a row is a few operations on an integer of len(b) + 1 bits, and
    `masks` is asked once per distinct token of `a`."""
    m = len(b)
    full = (1 << (m + 1)) - 1
    stars = sum(1 << j for j, t in enumerate(b) if t is star)
    known = {}
    row = 1
    for t in a:
        if t is star:
            row = full & ~((row & -row) - 1)            # a star goes on to every later j
        else:
            row |= (row & stars) << 1                   # ... and so does one of b's
            if t not in known:
                known[t] = masks(t)
            row = (row & stars) | ((row & known[t]) << 1)
        if not row:
            return False
    row |= (row & stars) << 1
    return bool(row >> m & 1)
