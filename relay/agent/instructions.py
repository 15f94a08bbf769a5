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
import shlex
import shutil
import sys
from pathlib import Path

PLACEHOLDER = "YOUR_NAME"           # the snippet's agent name: valid, and plainly to be replaced
PLACEHOLDER_TO = "OTHER_NAME"       # an example recipient where no other agent is known
MAX_LISTED = 40                     # other agents named in a block; `relay agents` has them all
ENV_ME = '"$RELAY_AGENT"'           # the agent in the commands of a file several agents read

TEMPLATE = """\
## relay: messages between the agents of this project

{{identity}}

relay carries messages between agents as files and keeps a ledger of them; they move while
`relay run` is going. Every command works anywhere in the project:

    {{R}} inbox {{me}}                    # your new messages, whole; marks nothing read
    {{R}} inbox {{me}} --wait 600 --ack   # waits for one (exit 124: none came), marks read what it printed
    {{R}} mark-read --agent {{me}} ID     # marks a message read by its id, once you dealt with it
    {{R}} read ID --agent {{me}}          # one message again, read or not (then marked read)
    {{R}} inbox {{me}} --recent 5         # the 5 newest you read already: nothing taken is lost
    {{R}} send --from {{me}} --to {{to}} --subject "tests are green" "the body"   # prints its id
    {{R}} send --from {{me}} --reply-to ID "the answer"   # to ID's sender, in its thread
    {{R}} search "tests green" --agent {{me}}   # your messages holding these words, newest first
    {{R}} audit --thread ID               # a conversation, from its first message
    {{R}} show ID                         # delivered to whom and when, or failed and why
    {{R}} audit --from {{me}} --status failed   # your sends that failed: fix the cause, send again
    {{R}} status                          # is relay running?

`--to` takes NAME[,NAME...] or `*` (everyone else); an unknown name is refused at once with the
closest one. A body of `-` is read from standard input. Retrying a send after a timeout? Give both
tries the same `--request-id R`: it is delivered once.

Without relay's command: from the project's top directory (the one holding `.relay/`), write the
file under a hidden name, then rename it into your outbox under a name used once:

    d=.relay/outbox/{{me}}; n=msg-$(date +%s%N)-$$
    printf 'TO: {{to}}\\nSUBJECT: hi\\n\\nthe body\\n' > "$d/.$n" && mv "$d/.$n" "$d/$n"

From Python, with the interpreter that has relay ({{PY}}):

    import relay
    me = relay.Agent({{me_py}})
    for m in me.wait(timeout=600):      # [] on timeout; me.inbox() returns at once, marking nothing
        me.reply(m, "done")             # to m.sender, in m's thread
        me.mark_read([m.id])
    me.send("{{to}}", "the body", subject="hi")

Through MCP, once relay's server is registered for you (`pip install 'agent-outbox-relay[mcp]'`, from a
checkout of relay `pip install '.[mcp]'`):

    claude mcp add relay-{{me}} -- {{R}} mcp --agent {{me}} --root {{root}}

Its tools: send, reply, inbox, wait, read, mark_read, search, agents, thread; each one's
description says whether it marks messages read.
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
    values = {"identity": identity, "R": relay, "PY": python, "me": me, "me_py": me_py, "to": to,
              "root": shlex.quote(str(root)) if root is not None else "/abs/path/to/project"}
    text = TEMPLATE
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value)
    assert "{{" not in text, "a placeholder of the template was left unfilled"
    return text


def snippet():
    """contrib/AGENT_SNIPPET.md's text."""
    return SNIPPET_PREFACE + render([PLACEHOLDER], None, relay="relay", python="python3")
