"""The text `relay adopt` writes into an agent's instructions file, and contrib/AGENT_SNIPPET.md.

One block per file, however many agents read it: what relay is, the commands, the fallback of
writing a file by hand, Python and MCP, in one template (under 60 lines). Who the reader is comes
first: in a file adopted for one agent, that agent's name, written into every command; in a file
several agents read, one line per agent saying how it is started (`RELAY_AGENT=NAME`), and the
commands name `"$RELAY_AGENT"`, which every verb, relay.Agent() and `relay mcp` also take as the
agent when none is named (an empty name is none).

Every command works as written from any shell in the project, even one whose PATH lacks relay's
virtual environment: relay's console script by its absolute path (or `PYTHON -m relay`), unless
the system's default PATH finds this installation's script itself.
"""
import os
import re
import shlex
import shutil
import sys
import textwrap
from pathlib import Path

from relay.agent.mcp_names import TOOLS

PLACEHOLDER = "YOUR_NAME"           # the snippet's agent name: valid, and plainly to be replaced
PLACEHOLDER_TO = "OTHER_NAME"       # an example recipient where no other agent is known
MAX_LISTED = 40                     # other agents named in a block; `relay agents` has them all
ENV_ME = '"$RELAY_AGENT"'           # the agent in the commands of a file several agents read
LINE = 100                          # the width the generated paragraphs are wrapped to

TEMPLATE = """\
## relay: messages between the agents of this project

{{identity}}

relay carries the agents' messages as files, with a ledger, while `relay run` goes. Anywhere in the project:

    {{R}} inbox {{me}}                    # your new messages, whole, urgent first; marks nothing read
    {{R}} inbox {{me}} --wait 600 --ack   # waits for one (exit 124: none came), marks read what it printed
    {{R}} mark-read --agent {{me}} ID     # marks a message read by its id (read ID --agent {{me}}: see it again)
    {{R}} ack ID --agent {{me}} --note "done"   # acknowledge one that asks it (ACK: required); the note goes back
    {{R}} send --from {{me}} --to {{to}} --subject "tests are green" "the body"   # prints its id
    {{R}} send --from {{me}} --reply-to ID "the answer"   # to ID's sender, in its thread
    {{R}} send --from {{me}} --to {{to}} --priority urgent --ack-required "merge it?"   # urgent first; asks an ack
    {{R}} show ID                         # per recipient: delivered, surfaced, read, acknowledged; or why it failed
    {{R}} overdue --agent {{me}}          # your sends whose acknowledgement is overdue (30m)
    {{R}} search "tests green" --agent {{me}}   # your messages holding these words, newest first
    {{R}} reserve --agent {{me}} src/parser --for 1h --exclusive --reason "lexer"   # before editing shared files
    {{R}} reservations                    # who holds which files until when; release --agent {{me}} --all
    {{R}} state list                      # team state; take a key: state set KEY VALUE --if-absent --as {{me}}

`--to` takes NAME[,NAME...] or `*` (everyone else); an unknown name is refused with the closest one.
`-` as the body reads standard input; a retry with the same `--request-id R` is delivered once.
`--wait-read 5m` or `--wait-acked 30m` on a send blocks until every recipient read or acknowledged
it (exit 0; 1 failed, saying why; 124 time out). A send that fails comes back as a bounce from
`System`, "Undelivered: <subject>", saying why: fix the cause and send again; never answer it
(`{{R}} audit --from {{me}} --status failed` lists your sends that failed).

{{guard}}

Without relay's command: from the project's top directory (the one holding `.relay/`), write the
file under a hidden name, then rename it into your outbox under a name used once:

    d=.relay/outbox/{{me}}; n=msg-$(date +%s%N)-$$
    printf 'TO: {{to}}\\nSUBJECT: hi\\n\\nthe body\\n' > "$d/.$n" && mv "$d/.$n" "$d/$n"

From Python, with the interpreter that has relay ({{PY}}):

    import relay
    me = relay.Agent({{me_py}})
    for m in me.wait(timeout=600):      # [] on timeout; me.inbox() returns at once, marking nothing
        me.reply(m, "done")             # to m.sender, in m's thread
        me.mark_read([m.id])            # or me.ack_message(m.id, note="done")
    me.send("{{to}}", "the body", subject="hi")   # me.receipts(id), me.reserve([...]), me.state_set(...)

Through MCP (`pip install 'agent-outbox-relay[mcp]'`; from a checkout of relay `pip install '.[mcp]'`):

    claude mcp add relay-{{me}} -- {{R}} mcp --agent {{me}} --root {{root}}

{{tools}}
"""

SNIPPET_PREFACE = """\
<!-- Rendered from relay/agent/instructions.py: `python -m relay.agent.adopt > contrib/AGENT_SNIPPET.md`. -->
Paste what follows into an agent's instructions and put its name for YOUR_NAME, or let
`relay adopt NAME [--file CLAUDE.md]` write it with the names and relay's path filled in.

"""


def command():
    """How to run this installation's relay from a shell whose PATH may lack it: `relay` when
    the system's default PATH finds this very script, else the script beside this Python (a
    virtual environment's bin/) by its absolute path, else `PYTHON -m relay`."""
    script = Path(sys.executable).parent / "relay"
    if not (script.is_file() and os.access(script, os.X_OK)):
        return f"{shlex.quote(sys.executable)} -m relay"
    found = shutil.which("relay", path=os.defpath)
    if found and os.path.realpath(found) == os.path.realpath(script):
        return "relay"
    return shlex.quote(str(script.absolute()))


def render(adopted, known=(), relay=None, python=None, root=None):
    """The instructions for a file the agents `adopted` read; `known`: every agent known (None:
    not known here, the snippet); `relay`, `python`: how to run them (command(), sys.executable);
    `root`: the project's, for the MCP server."""
    adopted = sorted(adopted)
    relay = relay or command()
    python = python or shlex.quote(sys.executable)
    others = None if known is None else sorted(set(known) - set(adopted))
    now = f"`{relay} agents` lists who is there now"
    if others is None:
        listed = f"the other agents: `{relay} agents` lists them"
    elif not others:
        listed = f"no other agent yet ({now})"
    else:
        listed = "the other agents: " + ", ".join(f"`{n}`" for n in others[:MAX_LISTED])
        if len(others) > MAX_LISTED:
            listed += f" and {len(others) - MAX_LISTED} more"
        listed += f" (when this was written; {now})"
    if len(adopted) == 1:
        me, me_py = adopted[0], f'"{adopted[0]}"'
        identity = f"You are the agent `{me}`; {listed}."
        if known is None:
            identity += ("\n`relay` is relay's command: where it is not on PATH, use its full path\n"
                         "(`/path/to/.venv/bin/relay`) or `python3 -m relay` with the Python that has relay.")
    else:
        me, me_py = ENV_ME, ""
        identity = "\n".join(
            ["This file is read by several agents, each started with its name in RELAY_AGENT:"]
            + [f"- `{n}`: `RELAY_AGENT={n}`" for n in adopted]
            + [f"{listed[0].upper()}{listed[1:]}.",
               'You are the one `echo "$RELAY_AGENT"` names; the commands below act as that agent.',
               "If it prints nothing, put `RELAY_AGENT=<your name>` before each command."])
    to = next(iter(others or []), PLACEHOLDER_TO if len(adopted) == 1 else adopted[0])
    if len(adopted) == 1:
        commit = (f"commit as `RELAY_AGENT={me} git commit ...` (or once, in a clone only you commit in, "
                  f"`git config relay.agent {me}`).")
        inbox = f"relay://inbox/{me}"
    else:
        commit = ("commit with your RELAY_AGENT set, as for every command (`RELAY_AGENT=<your name> git "
                  "commit ...`).")
        inbox = "relay://inbox/<your name>"
    guard = wrap(
        f"Reservations are advisory; the git guard (`{relay} guard install`) refuses a commit of files another agent "
        f"reserved exclusively. It must know who commits: {commit} Unnamed, every exclusive reservation counts as "
        f"another's, yours too. In Claude Code, `{relay} hook install claude --agent {me}` brings new mail into "
        "your session unasked (at its start, with each prompt and tool call) and holds a stop while mail waits "
        "unseen.")
    tools = wrap(f"Its tools: {', '.join(TOOLS)}; each one's description says what it does and whether "
                          f"it marks messages read. Subscribe to {inbox} to hear of new mail.")
    values = {"identity": identity, "R": relay, "PY": python, "me": me, "me_py": me_py, "to": to,
              "guard": guard, "tools": tools,
              "root": shlex.quote(str(root)) if root is not None else "/abs/path/to/project"}
    text = TEMPLATE
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value)
    assert "{{" not in text, "a placeholder of the template was left unfilled"
    return text


def wrap(text):
    """`text` filled to LINE columns, never breaking a `code span` (a command is copied whole)."""
    spans = re.split(r"(`[^`]*`)", text)
    kept = "".join(p.replace(" ", "\0") if p.startswith("`") else p for p in spans)
    return textwrap.fill(kept, LINE, break_long_words=False, break_on_hyphens=False).replace("\0", " ")


def snippet():
    """contrib/AGENT_SNIPPET.md's text."""
    return SNIPPET_PREFACE + render([PLACEHOLDER], None, relay="relay", python="python3")
