"""The paths and globs of file reservations: normalised relative to the project root, kept
inside it, and whether two of them overlap, decided soundly (checked against an independent
matcher on a universe of paths)."""
import fnmatch
import functools
import itertools
import random
import re

import pytest

from relay.errors import RelayError
from relay.files.patterns import covers, normalise, overlap, scope


@pytest.mark.parametrize("given, stored", [
    ("src/app.py", "src/app.py"),
    ("./src//app.py", "src/app.py"),
    ("src/", "src"),
    ("src/lib/../app.py", "src/app.py"),
    (".", "."),
    ("./", "."),
    ("src/**/*.py", "src/**/*.py"),
    ("src/a**b", "src/a*b"),            # ** only as a whole segment; inside one it is *
])
def test_paths_are_normalised_relative_to_the_root(tmp_path, given, stored):
    assert normalise(given, tmp_path) == stored


def test_absolute_paths_inside_the_root_and_paths_from_a_sub_directory(tmp_path):
    (tmp_path / "src").mkdir()
    assert normalise(str(tmp_path / "src" / "app.py"), tmp_path) == "src/app.py"
    assert normalise(str(tmp_path), tmp_path) == "."
    assert normalise("app.py", tmp_path, base=tmp_path / "src") == "src/app.py"
    assert normalise("*.py", tmp_path, base=tmp_path / "src") == "src/*.py"
    assert normalise("../README.md", tmp_path, base=tmp_path / "src") == "README.md"


@pytest.mark.parametrize("given", ["../x", "src/../../x", "/etc/passwd", "", "a\nb", "a\x1b[31m",
                                   "src/[z-a].py", "x" * 5000])
def test_what_leaves_the_root_or_can_match_nothing_is_refused(tmp_path, given):
    with pytest.raises(RelayError):
        normalise(given, tmp_path)


def test_a_sub_directory_outside_the_root_is_refused(tmp_path):
    root = tmp_path / "project"
    root.mkdir()
    with pytest.raises(RelayError, match="outside the project"):
        normalise("x.py", root, base=tmp_path)


@pytest.mark.parametrize("a, b, meet", [
    ("src", "src/app.py", True),                # a path under a reserved directory
    ("src/app.py", "src/app.py", True),
    ("src/app.py", "src/apps.py", False),
    ("src", "srcx/a.py", False),                # a prefix only at a segment's end
    ("src/*.py", "src/app.py", True),
    ("src/*.py", "src/lib/app.py", False),      # * never crosses /
    ("src/**/*.py", "src/lib/app.py", True),
    ("src/**/*.py", "src/app.py", True),        # ** is zero or more segments
    ("src/*.py", "src/*.md", False),
    ("src/a*", "src/*b", True),                 # both match src/ab
    ("*.py", "docs", False),
    ("**/*.md", "docs", True),                  # docs/x.md
    ("docs/[a-c]*.md", "docs/d*.md", False),
    ("src/[a-zc].py", "src/x.py", True),        # a range that holds a later one keeps its end
    ("src/[a-mb-d].py", "src/k.py", True),
    ("docs/[!a]*", "docs/a*", False),
    ("docs/[^a]*", "docs/b", True),
    ("docs/?", "docs/ab", False),
    ("docs/??", "docs/ab", True),
    (".", "anything/at/all", True),             # the whole project
    ("src/*", "src/lib", True),
    ("src/*", "src/lib/deep/x.py", False),      # a glob holds what it matches, not what is under that
    ("src/**", "src/lib/deep/x.py", True),      # ... which ** says
    ("**/*.py", "**/*.md", False),
    ("a/**/b", "a/b", True),
    ("a/**/b/c", "a/x/y/b/c", True),
    ("*/src", "lib/*", True),                   # lib/src
    ("a/*/c", "a/b/d", False),
    ("**/x", "**/y", False),
    ("**/x", "y", True),                        # y/x: the plain path y holds what is under it
    ("**/x", "y/**", True),                     # y/x
])
def test_overlap(a, b, meet):
    assert overlap(a, b) is meet
    assert overlap(b, a) is meet


# An independent matcher: fnmatch's own translation for each segment, ** as any run of whole
# segments, and a plain path holding everything under it.
def matches(pattern, path):
    segs = [] if pattern == "." else pattern.split("/")
    if not any(c in pattern for c in "*?["):
        segs.append("**")
    parts = path.split("/")

    def m(i, j):
        if i == len(segs):
            return j == len(parts)
        if segs[i] == "**":
            return m(i + 1, j) or (j < len(parts) and m(i, j + 1))
        return j < len(parts) and segment(segs[i]).fullmatch(parts[j]) is not None and m(i + 1, j + 1)
    return m(0, 0)


@functools.lru_cache(maxsize=None)
def segment(glob):
    return re.compile(fnmatch.translate(glob))


NAMES = ["a", "b", "ab", "ba", "x.py", "a.py", "a.md", "b.md", ".h"]
UNIVERSE = ["/".join(p) for n in (1, 2, 3) for p in itertools.product(NAMES, repeat=n)]
PATTERNS = ["a", "a/b", "*", "*.py", "a*", "*b", "?", "??", "[ab]", "[!a]*", "a/*", "*/b", "**/x.py", "a/**",
            "a/**/b", "**/*.md", "b/*/a", ".", "ab/?a", "*/*.py", "[a-b]?"]


def test_overlap_is_sound_against_an_independent_matcher():
    """Wherever some path is covered by both patterns, overlap says so; and where it says so
    for these patterns, such a path is in the universe."""
    for a, b in itertools.combinations_with_replacement(PATTERNS, 2):
        witness = next((u for u in UNIVERSE if matches(a, u) and matches(b, u)), None)
        assert overlap(a, b) is (witness is not None), (a, b, witness)


def test_covers_a_file():
    assert covers("src", "src/app.py")
    assert covers("src/*.py", "src/app.py")
    assert covers("src/**", "src/lib/app.py") and not covers("src/*", "src/lib/app.py")
    assert not covers("src/*.py", "src/lib/app.py")
    assert covers("**/*.md", "README.md")
    assert not covers("src/app.py", "src/app.pyc")
    # a file name holding glob characters is taken as it is written
    assert covers("docs", "docs/[draft]*.md")
    assert not covers("docs/a.md", "docs/[a].md")


def test_a_plain_path_naming_an_existing_file_holds_only_that_file(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.py").write_text("")
    assert [scope(p, tmp_path) for p in ("src", "src/app.py", "src/new.py", "src/*.py", ".")] == [
        "tree", "file", "tree", "glob", "tree"]
    assert not overlap("src/app.py", "**/*.md", "file", "glob")
    assert overlap("src/new.py", "**/*.md", "tree", "glob")           # src/new.py/x.md
    assert overlap("src/app.py", "src", "file", "tree")
    assert overlap("src/app.py", "src/app.py", "file", "tree")
    assert not overlap("src/app.py", "src/app.py/x", "file", "tree")
    assert covers("src/app.py", "src/app.py", "file") and not covers("src/app.py", "src/app.py/x", "file")
    # a link is the entry it is, never what it points to: a link to a directory is one file
    (tmp_path / "lib").symlink_to(tmp_path / "src", target_is_directory=True)
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    assert [scope(p, tmp_path) for p in ("lib", "gone")] == ["file", "file"]


LONG = "*a" * 240                       # 480 characters: under the bound of 1,024


@pytest.mark.parametrize("other, meet", [
    (LONG, True),
    ("*b" * 240, False),                # one ends in a, the other in b
    ("a" * 240, True),
    ("a" * 239, False),                 # 240 a's are needed, and this tree is one name of 239
    ("*a" * 240 + "/x", False),         # two segments: LONG holds names of one
    ("[!a]" * 250, False),
    ("?" * 500, True),
    ("/".join(["**", "a"] * 200), False),  # 400 segments: LONG is one
    ("b/" * 499 + "b", False),
])
def test_overlap_of_long_patterns_is_decided_without_recursion(other, meet):
    """Patterns under the bound of MAX_PATTERN characters, long in characters and in segments."""
    assert overlap(LONG, other) is meet and overlap(other, LONG) is meet


@pytest.mark.parametrize("c, ok", [("\ud7ff", True), ("\ud800", False), ("\udfff", False), ("\ue000", True)])
def test_a_path_holding_a_lone_surrogate_is_refused_and_its_neighbours_are_not(tmp_path, c, ok):
    """A lone surrogate stands for bytes that are not UTF-8 (os.fsdecode's escapes); the code
    points either side of the surrogates are characters like any other."""
    if ok:
        assert normalise(f"src/a{c}b", tmp_path) == f"src/a{c}b"
    else:
        with pytest.raises(RelayError, match="bytes that are not UTF-8"):
            normalise(f"src/a{c}b", tmp_path)


def test_overlap_of_patterns_of_many_segments():
    deep = "a/" * 499 + "a"                                         # 500 segments, 999 characters
    assert overlap("/".join(["**", "a"] * 200), deep)               # a glob of 400 segments, ending in a
    assert not overlap("/".join(["**", "a"] * 200) + "/b", deep + "/c", "glob", "file")
    assert overlap("/".join(["**"] * 300), deep) and covers("**/" * 300 + "a", deep)
    assert not covers("/".join(["*"] * 499), deep)                   # one segment short


def random_segment(rng, tokens, most):
    return "".join(rng.choice(tokens) for _ in range(rng.randint(1, most)))


def brute_force_overlap(a, b, universe):
    return any(matches(a, u) and matches(b, u) for u in universe)


def test_overlap_agrees_with_brute_force_on_random_names():
    """One segment each, up to 3 tokens: a common name, if there is one, has at most 6 characters
    (each character of a shortest one is taken by a token that is not *), and c stands for every
    character the patterns do not name."""
    rng = random.Random(38)
    tokens = ["a", "b", "*", "?", "[ab]", "[!a]", "[a-b]", "[!ab]"]
    names = ["".join(p) for n in range(1, 7) for p in itertools.product("abc", repeat=n)]
    for _ in range(300):
        a, b = (random_segment(rng, tokens, 3) for _ in range(2))
        if a == "**" or b == "**":
            continue
        assert overlap(a, b) is brute_force_overlap(a, b, names), (a, b)


def test_overlap_agrees_with_brute_force_on_random_paths():
    """Up to 3 segments each, of names of one character (or a*): a common path, if there is one,
    has at most 6 segments of one character."""
    rng = random.Random(39)
    segments = ["a", "b", "*", "?", "[ab]", "[!a]", "**", "a*"]
    paths = ["/".join(p) for n in range(1, 7) for p in itertools.product("abc", repeat=n)]
    for _ in range(300):
        a, b = ("/".join(rng.choice(segments) for _ in range(rng.randint(1, 3))) for _ in range(2))
        assert overlap(a, b) is brute_force_overlap(a, b, paths), (a, b)


def test_a_work_takes_exactly_its_limit_of_steps_and_refuses_the_next_naming_the_limit():
    from relay.files.patterns import TooMuchWork, Work
    work = Work(limit=10)
    work.spend(4)
    work.spend(6)
    assert work.spent == 10
    with pytest.raises(TooMuchWork, match="more than 10 steps") as refused:
        work.spend(1)
    assert refused.value.limit == 10
    assert overlap("a/*.py", "a/b.py", work=Work(limit=10_000)) is True


def test_a_work_counts_two_segments_compared_once_then_one_step_each_time_again():
    from relay.files.patterns import Work
    work = Work()
    assert overlap("src/*.py", "src/a*", work=work) is True
    first = work.spent
    assert first > 2
    assert overlap("src/*.py", "src/a*", work=work) is True
    again = work.spent - first
    assert 0 < again < first


@pytest.mark.parametrize("glob, name, held", [
    ("[]a]x", "]x", True), ("[]a]x", "ax", True), ("[]a]x", "bx", False),
    ("[!]a]x", "]x", False), ("[!]a]x", "bx", True), ("[^]]x", "ax", True), ("[^]]x", "]x", False),
    ("[a-c]", "b", True), ("[a-c]", "d", False), ("[!a-c]", "d", True), ("[!a-c]", "a", False),
])
def test_a_set_may_hold_a_closing_bracket_first_negated_or_not(glob, name, held):
    assert covers(glob, name) is held
    assert overlap(glob, name) is held


@pytest.mark.parametrize("length, ok", [(1024, True), (1025, False)])
def test_a_path_of_up_to_1024_characters_is_taken(tmp_path, length, ok):
    text = "/".join(["a" * 99] * 20)
    text = (text + "/" + "b" * length)[:length]
    if ok:
        assert normalise(text, tmp_path) == text
    else:
        with pytest.raises(RelayError, match=f"a path of {length} characters; at most 1024"):
            normalise(text, tmp_path)


@pytest.mark.parametrize("pattern, glob", [("src/a]b", False), ("src/a[b", False), ("src/]b[", False),
                                           ("src/a[b]", True), ("src/[]]", True), ("src/a?", True)])
def test_only_a_bracket_that_opens_a_closed_set_makes_a_glob(tmp_path, pattern, glob):
    assert scope(pattern, tmp_path) == ("glob" if glob else "tree")
    assert covers(pattern, pattern + "/under") is (not glob)


@pytest.mark.parametrize("glob, name, held", [
    ("[!\U0010fffe]", "\U0010ffff", True), ("[!\U0010fffe]", "\U0010fffe", False),
    ("[!\U0010ffff]", "\U0010fffe", True), ("[!\U0010ffff]", "\U0010ffff", False),
    ("[!a]", "b", True), ("[!ab]", "c", True), ("[!ab]", "b", False),
])
def test_a_negated_set_holds_every_other_character_up_to_the_last_one(glob, name, held):
    assert covers(glob, name) is held


@pytest.mark.parametrize("glob, name, held", [
    ("[a-]", "-", True), ("[a-]", "a", True), ("[a-]", "b", False),
    ("[-a]", "-", True), ("[-a]", "b", False), ("[a-c-e]", "-", True), ("[a-c-e]", "d", False),
    ("[c-a]", "b", False), ("[c-ax]", "x", True),
])
def test_a_dash_at_a_sets_end_is_itself_and_a_range_written_backwards_holds_nothing(glob, name, held):
    assert covers(glob, name) is held


@pytest.mark.parametrize("given, reason", [
    ("", "an empty path: name a file"), ("  \t", "an empty path: name a file"), (None, "an empty path: name a file"),
    ("../x", r"\.\./x leads outside the project"), ("src/../../x", r"src/\.\./\.\./x leads outside the project"),
    ("/etc/passwd", "/etc/passwd is outside the project"), ("src/[z-a].py", r"matches no name \(an empty character set\)"),
    ("a\nb", "holds a control character"),
])
def test_each_refused_path_says_why(tmp_path, given, reason):
    with pytest.raises(RelayError, match=reason):
        normalise(given, tmp_path)


@pytest.mark.parametrize("glob, name, held", [
    ("[axb]", "x", True), ("[axb]", "a", True), ("[axb]", "b", True), ("[axb]", "c", False),
    ("[zab]", "z", True), ("[zab]", "m", False), ("[a-cx]", "b", True), ("[a-cx]", "x", True), ("[a-cx]", "d", False),
])
def test_three_characters_of_a_set_are_a_range_only_with_a_dash_between(glob, name, held):
    assert covers(glob, name) is held
