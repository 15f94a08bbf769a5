"""What relay writes for people to read: one gate for every line, so that nothing an agent wrote
(a subject, a body, a thread, a header, a file name) drives the terminal it is shown on.

`UNSAFE` is every character a terminal or a text display acts on rather than shows: the C0
controls (ESC starts CSI, OSC 52 sets the clipboard, OSC 8 forges a link), DEL, the C1 controls
U+0080-U+009F (U+009B is a one-character CSI, U+009D an OSC), the bidi controls that reorder what
is shown (U+061C, U+200E-U+200F, U+202A-U+202E, U+2066-U+2069) and the line and paragraph
separators U+2028-U+2029 (str.splitlines() and many viewers break lines there).

- `escaped(text)`: each unsafe character as a visible escape (`\\x1b`, `\\x9b`, `\\u202e`), newline
  and tab kept; an undecodable byte of a file name (a surrogate escape) as `\\xNN`. `echo()`
  prints through it: the CLI prints nothing any other way, its error lines included.
- `spaced(text)`: each unsafe character (newline and tab too) as a space, where a value must stay
  one plain line (a hook's environment, a table's cell).
- `json_text(doc)`: JSON whose strings escape the unsafe characters JSON does not require to be
  escaped (orjson writes C1, DEL, the bidi controls and U+2028-U+2029 raw): the same document for
  any JSON reader, printable on a terminal, one line per document with `str.splitlines()` too.
"""
import orjson

BIDI = frozenset({0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)})
UNSAFE = frozenset({*range(0x20), 0x7F, *range(0x80, 0xA0), *BIDI, 0x2028, 0x2029})

_SHOWN = {c: (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in UNSAFE} | {
    c: f"\\x{c - 0xDC00:02x}" for c in range(0xDC80, 0xDD00)}                   # undecodable bytes
_SURROGATES = {c: f"\\u{c:04x}" for c in range(0xD800, 0xE000) if c not in _SHOWN}
_SPACED = dict.fromkeys([*UNSAFE, *range(0xD800, 0xE000)], " ")
_IN_JSON = {c: f"\\u{c:04x}" for c in UNSAFE if c >= 0x7F}       # orjson escapes the C0 controls itself


def unsafe(char):
    return ord(char) in UNSAFE


_TABLES = {}        # keep -> the translation table of escaped()


def escaped(text, keep="\n\t"):
    """`text` with every unsafe character (but those in `keep`) as a visible escape."""
    text = "" if text is None else str(text)
    if text.isascii() and text.isprintable():
        return text         # nothing to escape (the common case, without building a table)
    table = _TABLES.get(keep)
    if table is None:
        table = _TABLES[keep] = {c: v for c, v in (_SHOWN | _SURROGATES).items() if chr(c) not in keep}
    return text.translate(table)


def spaced(text):
    """`text` with every unsafe character, newline and tab included, as a space: one plain line."""
    return ("" if text is None else str(text)).translate(_SPACED)


def echo(text="", err=False, nl=True):
    """Print `text` for a person (stdout, or stderr with `err`) through the gate."""
    import click
    click.echo(escaped(text), err=err, nl=nl)


def json_text(doc, indent=False):
    """`doc` as JSON text, with no unsafe character raw (see the module's text)."""
    text = orjson.dumps(doc, option=orjson.OPT_INDENT_2 if indent else 0).decode()
    return text.translate(_IN_JSON) if not text.isascii() or "\x7f" in text else text


def echo_json(doc, indent=False):
    import click
    click.echo(json_text(doc, indent))
