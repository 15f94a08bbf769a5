"""`relay adopt`: an agent's instructions for talking through relay, kept in a marked block of a
file the agent reads (AGENTS.md, CLAUDE.md).

One template gives both that block and contrib/AGENT_SNIPPET.md (rendered with the placeholder
name YOUR_NAME), so the two cannot drift; `python -m relay.adopt > contrib/AGENT_SNIPPET.md`
writes the snippet again after the template changes.

The block lies between `<!-- relay:begin agent=NAME -->` and `<!-- relay:end agent=NAME -->`
lines. A second run replaces it in place; text outside every block is never changed; each agent
has a block of its own. A file whose relay markers do not pair up is refused, never rewritten.

The file lies outside the state directory, in the project, where agents write too: its path is
relative to the project root (no '..'; an absolute one only inside the root), and its directory is
reached from the root one component at a time without following a link (fs.StateDir, opened on
the root), then held by its descriptor, through which everything after goes;
the file is read with O_NOFOLLOW (a symbolic link is refused, never written through) and must
be a regular file; the new text goes to a temporary file beside it, synced, renamed over the
old one only if that is still the file that was read, and the directory is synced. Two adopt
runs take turns (flock on the directory); a hand edit made while one runs, up to the instant
of its rename, is noticed and not overwritten.
"""
import errno
import fcntl
import os
import re
import secrets
import stat
import sys
from pathlib import Path

from relay.agent.api import check_known, declare
from relay.errors import RelayError
from relay.files.fs import StateDir, Unsafe, write_all
from relay.files.layout import is_inside

DEFAULT_FILE = "AGENTS.md"
PLACEHOLDER = "YOUR_NAME"           # the snippet's agent name: valid, and plainly to be replaced
PLACEHOLDER_TO = "OTHER_NAME"       # an example recipient where no other agent is known
MAX_FILE_BYTES = 4 * 1024 * 1024    # an instructions file larger than this is not one
MAX_LISTED = 40                     # other agents named in a block; `relay agents` has them all

BEGIN, END = "<!-- relay:begin agent={} -->", "<!-- relay:end agent={} -->"
MARKER = re.compile(r"<!--\s*relay:")                                   # any line that claims to be one
EXACT = re.compile(r"<!-- relay:(begin|end) agent=([A-Za-z0-9][A-Za-z0-9._-]{0,63}) -->\Z")

TEMPLATE = """\
## relay: messages for agent `{{me}}`

You are agent `{{me}}` (a file may hold one such section per agent: follow the one with your
name). The other agents: {{others}}.
relay carries messages between agents as files and keeps a ledger of them. Every command below
works anywhere inside the project; messages move while `relay run` is going (`relay status`).

### Read and wait

    relay inbox {{me}}                   # each new message whole: from, to, thread, subject, time, id, body
    relay inbox {{me}} --ack             # the same, then marks read exactly what it printed
    relay inbox {{me}} --wait 600 --ack  # blocks until one comes; on timeout exit 124 (stdout empty)
    relay read ID --agent {{me}}         # one message, marked read

Nothing is marked read without `--ack` (or `relay read --agent`). `--json`/`--jsonl` print JSON.

### Send and reply

    relay send --from {{me}} --to {{to}} --subject "tests are green" "the body"   # prints the id
    relay send --from {{me}} --to {{to}} --thread review-42 - <<'EOF'
    a longer body, from standard input
    EOF
    relay send --from {{me}} --reply-to ID "the answer"   # to ID's sender, in its thread

`--to` takes NAME[,NAME...] or `*` (everyone else); a name relay does not know is refused at once
(exit 1, "did you mean ...?"). When you retry a send after a timeout, give both tries the same
`--request-id R`: relay delivers it once and prints the first message's id.
`relay audit --thread T` lists a thread in order.

### Did it arrive?

`relay show ID` tells a message's story: delivered to whom and when, or failed and why.
`relay audit --from {{me}} --status failed` lists your messages that failed; each file is kept as
`.relay/failed/{{me}}/<id>--<name>` beside `<id>--<name>.error.json`, which gives the reason.
Fix the cause and send again.

### Without the CLI: write a file

Write it under a name starting with `.`, then rename it into your outbox under a name used once
(a name reused before relay took the first file would replace that message). The path is from
the project's top directory (the one holding `.relay/`):

    d=.relay/outbox/{{me}}; n=msg-$(date +%s%N)-$$
    printf 'TO: {{to}}\\nSUBJECT: hi\\nTHREAD: review-42\\n\\nthe body\\n' > "$d/.$n" && mv "$d/.$n" "$d/$n"

Headers `TO`, `SUBJECT`, `THREAD`, `REQUEST-ID`, `ID` (an id you choose: 26 characters of relay's
id alphabet, unused), a blank line, the body; or JSON with the keys `to`, `subject`, `thread`,
`body`, `request_id`, `id`. Your new messages are `.relay/inbox/{{me}}/new/<id>.json`.

### Python

    import relay
    me = relay.Agent("{{me}}")
    mid = me.send("{{to}}", "the body", subject="hi", thread="review-42", request_id=None)
    msgs = me.wait(timeout=600)      # [] on timeout; me.inbox() returns at once
    for m in msgs:
        print(m.sender, m.subject, m.body)
        me.reply(m, "done")          # to m.sender, in m's thread
    me.ack(msgs)                     # marks them read

### MCP

With relay's MCP server registered for you, use its tools: `send(to, body, subject, thread,
request_id)`, `inbox()` (new messages with bodies; marks read what it returns), `wait(timeout_s)`,
`agents()`, `thread(thread)`. To reply, `send` to the message's sender with its thread (its id
when it has none). Register it (the `mcp` extra: `pip install 'agent-outbox-relay[mcp]'`) from the project root:

    claude mcp add relay-{{me}} -- "$(command -v relay)" mcp --agent {{me}} --root "$PWD"

Other clients, with absolute paths:

    {"mcpServers": {"relay": {"command": "/abs/path/to/relay", "args": ["mcp", "--agent", "{{me}}", "--root", "/abs/path/to/project"]}}}
"""

SNIPPET_PREFACE = """\
<!-- Rendered from relay/adopt.py: `python -m relay.adopt > contrib/AGENT_SNIPPET.md`. -->
Paste what follows into an agent's instructions and put its name for YOUR_NAME, or let
`relay adopt NAME [--file CLAUDE.md]` write it into AGENTS.md with the names filled in.

"""


def render(me, others=None):
    """The instructions for agent `me`; `others` the other agents' names (None: not known here)."""
    now = "`relay agents` lists who is there now"
    if others is None:
        listed, to = now.replace("who is there now", "them"), PLACEHOLDER_TO
    elif not others:
        listed, to = f"none yet ({now})", PLACEHOLDER_TO
    else:
        names = sorted(others)
        listed = ", ".join(f"`{n}`" for n in names[:MAX_LISTED])
        if len(names) > MAX_LISTED:
            listed += f" and {len(names) - MAX_LISTED} more"
        listed += f" (when this was written; {now})"
        to = names[0]
    text = TEMPLATE.replace("{{others}}", listed).replace("{{to}}", to).replace("{{me}}", me)
    assert "{{" not in text, "a placeholder of the template was left unfilled"
    return text


def snippet():
    """contrib/AGENT_SNIPPET.md's text."""
    return SNIPPET_PREFACE + render(PLACEHOLDER)


def block(me, others):
    """The marked block for agent `me`, ending in a newline."""
    return (BEGIN.format(me) + "\n<!-- written by `relay adopt " + me + "`: run it again to update; "
            "edit outside the markers -->\n" + render(me, others) + END.format(me) + "\n")


# -- placing the block in a file ----------------------------------------------------------------

def blocks(text, where):
    """{agent: (start, end)} character offsets of each agent's block, end marker's line included.
    A marker that is not exactly one of ours, a begin with no end, an end with no begin, blocks
    inside each other and a second block for one agent are refused: RelayError naming the line."""
    found, open_, offset = {}, None, 0
    for number, line in enumerate(text.split("\n"), 1):
        start, offset = offset, offset + len(line) + 1
        if number == 1 and line.startswith("\ufeff"):     # a byte order mark stays where it is
            start, line = 1, line[1:]
        bare = line.strip()
        if not MARKER.match(bare):
            continue
        m = EXACT.match(bare)
        if not m:
            raise refused(where, number, f"{bare[:80]!r} is not a relay marker adopt can read "
                          f"(expected {BEGIN.format('NAME')!r} or {END.format('NAME')!r})")
        kind, agent = m.groups()
        if kind == "begin":
            if open_ is not None:
                raise refused(where, number, f"a begin marker for {agent} inside the block of {open_[0]}, "
                              f"whose end marker is missing")
            if agent in found:
                raise refused(where, number, f"a second block for agent {agent}")
            open_ = (agent, start, number)
        else:
            if open_ is None or open_[0] != agent:
                raise refused(where, number, f"an end marker for {agent} with no begin marker for {agent} before it")
            found[agent] = (open_[1], min(offset, len(text)))
            open_ = None
    if open_ is not None:
        raise refused(where, open_[2], f"the begin marker for {open_[0]} has no end marker")
    return found


def refused(where, line, what):
    return RelayError(f"{where}:{line}: {what}; mend the markers by hand (the file is left as it is)")


def place(text, me, new_block, where):
    """`text` with agent `me`'s block replaced by `new_block`, or added at the end."""
    newline = "\r\n" if "\r\n" in text else "\n"
    if newline != "\n":
        new_block = new_block.replace("\n", newline)
    found = blocks(text, where)
    if me in found:
        start, end = found[me]
        if end == len(text) and not text.endswith("\n"):      # the end marker was the last line
            new_block = new_block[:-len(newline)]
        return text[:start] + new_block + text[end:]
    if text and not text.endswith("\n"):
        text += newline
    if text.strip():
        text += newline
    return text + new_block


# -- the file -----------------------------------------------------------------------------------

def target(root, state, file_=None):
    """The file to write: `file_` relative to the project root (an absolute path only inside
    it), or AGENTS.md there. No '..', never a file inside the state directory. The directories on
    the way are looked at only when it is opened (`open_parent`, never through a link)."""
    given = file_ or DEFAULT_FILE
    path = Path(given)
    where = f"--file {given!r}"
    if ".." in path.parts:
        raise RelayError(f"{where} holds '..'; relay adopt writes a file relative to the project root "
                         f"{root}, inside it")
    if path.is_absolute():
        try:
            path = path.relative_to(root)
        except ValueError:
            raise RelayError(f"{where} is not inside the project root {root}; relay adopt writes a file "
                             "relative to the project root, inside it") from None
    if not path.parts or path.name in ("", "."):
        raise RelayError(f"{where} names no file; relay adopt writes a file relative to the project root")
    path = Path(root) / path
    if is_inside(path, state) or is_inside(path.parent, state):
        raise RelayError(f"{path} is inside the state directory {state}; relay adopt writes an "
                         "instructions file of the project (e.g. AGENTS.md or CLAUDE.md)")
    return path


def open_parent(path, root=None):
    """A descriptor of the directory `path` is in. With `root` (the project root) it is walked
    down from there one directory at a time with O_NOFOLLOW (fs.StateDir): a symbolic link on
    the way is refused, and everything after goes through the descriptor, so a directory
    swapped for a link later changes nothing."""
    parent = path.parent
    rel = "" if root is None else "/".join(parent.relative_to(root).parts)
    top = None
    try:
        top = StateDir(parent if root is None else root)
        return top.open_dir(rel) if rel else os.dup(top.fd)
    except FileNotFoundError:
        raise RelayError(f"no directory {parent} to write {path.name} in") from None
    except Unsafe:
        link = _link(Path(parent if root is None else root), rel)
        if link is None:
            raise RelayError(f"{parent} is not a directory to write {path.name} in") from None
        raise RelayError(f"{link} is a symbolic link; relay adopt never writes through one (agents can plant "
                         "them): give --file the real path, or remove the link") from None
    finally:
        if top is not None:
            top.close()


def _link(root, rel):
    """The first symbolic link on the way from `root` down `rel` (what made the walk stop), if any."""
    parts = rel.split("/") if rel else []
    for i in range(1, len(parts) + 1):
        if root.joinpath(*parts[:i]).is_symlink():
            return root.joinpath(*parts[:i])
    return None


def check(path, root=None):
    """Refuse, as `update` would, a file that cannot take a block (a link, broken markers)."""
    path = Path(path)
    dfd = open_parent(path, root)
    try:
        blocks(read(dfd, path)[0] or "", path)
    finally:
        os.close(dfd)


def update(path, me, new_block, fsync=None, root=None):
    """Write `new_block` into the file at `path` for agent `me`: 'added', 'updated' or 'unchanged'.
    `root`: the directory the walk to `path` starts from (open_parent)."""
    if fsync is None:
        from relay.files.sync import default_fsync as fsync
    path = Path(path)
    dfd = open_parent(path, root)
    try:
        fcntl.flock(dfd, fcntl.LOCK_EX)         # two adopt runs on one directory take turns
        old, seen = read(dfd, path)
        new = place(old or "", me, new_block, path)
        if new == old:
            return "unchanged"
        replace(dfd, path, new.encode("utf-8"), seen, fsync)
        return "updated" if old is not None and me in blocks(old, path) else "added"
    finally:
        os.close(dfd)


def read(dfd, path):
    """(text, stat) of the file, or (None, None) when there is none. Never through a link."""
    link = RelayError(f"{path} is a symbolic link; relay adopt never writes through one (agents can "
                      "plant them): give --file the real path, or remove the link")
    try:
        if stat.S_ISLNK(os.stat(path.name, dir_fd=dfd, follow_symlinks=False).st_mode):
            raise link
        fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        if e.errno == errno.ELOOP:              # made a link since the look
            raise link from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RelayError(f"{path} is not a regular file; relay adopt writes only a plain text file")
        if st.st_size > MAX_FILE_BYTES:
            raise RelayError(f"{path} is {st.st_size} bytes, more than an instructions file of "
                             f"{MAX_FILE_BYTES // 1024 // 1024} MiB; give --file another file")
        data = b""
        while chunk := os.read(fd, 1 << 20):
            data += chunk
            if len(data) > MAX_FILE_BYTES:
                raise RelayError(f"{path} grew past {MAX_FILE_BYTES // 1024 // 1024} MiB while it was read")
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8"), st
    except UnicodeDecodeError as e:
        raise RelayError(f"{path} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
                         "relay adopt changes only a text file") from None


def same_file(a, b):
    return (a is None) == (b is None) and (a is None or (a.st_dev, a.st_ino, a.st_size, a.st_mtime_ns)
                                           == (b.st_dev, b.st_ino, b.st_size, b.st_mtime_ns))


def replace(dfd, path, data, seen, fsync):
    """Put `data` at `path` atomically, if the file there is still `seen` (None: there was none)."""
    tmp = f".{path.name}.relay-adopt-{secrets.token_hex(6)}.tmp"
    mode = stat.S_IMODE(seen.st_mode) if seen else 0o666         # a new file: 0o666 less the umask
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
    done = False
    try:
        try:
            if seen:
                os.fchmod(fd, mode)
                if (seen.st_uid, seen.st_gid) != (os.geteuid(), os.getegid()):
                    try:
                        os.fchown(fd, seen.st_uid, seen.st_gid)
                    except PermissionError:
                        pass
            write_all(fd, data)
            fsync(fd)
        finally:
            os.close(fd)
        try:
            now = os.stat(path.name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            now = None
        if not same_file(seen, now):
            raise RelayError(f"{path} changed while relay adopt ran; nothing was written: run it again")
        os.rename(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        done = True
        fsync(dfd)
    finally:
        if not done:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass


# -- the agent ----------------------------------------------------------------------------------

def adopt(layout, configured, agent, path, create=False, fsync=None, root=None):
    """Write agent `agent`'s block into `path` (walked from `root`, never through a link). An
    agent relay does not know is refused unless `create`, which makes its outbox and inbox.
    Returns 'added', 'updated' or 'unchanged'."""
    known = layout.agent_names(configured)
    if agent not in known:
        if not create:
            check_known(agent, known, "agent")
        check(path, root)                       # a file adopt would refuse creates no agent
        problems = layout.init([agent])
        if problems:
            raise RelayError("; ".join(problems))
        declare(layout, [agent], "relay adopt --create")
    return update(path, agent, block(agent, known - {agent}), fsync=fsync, root=root)


if __name__ == "__main__":
    sys.stdout.write(snippet())
