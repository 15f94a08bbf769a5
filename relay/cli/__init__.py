"""The command line: one click group (group.py) and the verbs, each module a list of commands the
group adds (it imports them; none imports the group back). context.py holds what every verb
shares: the project found, its configuration, JSON and verdict printing, logging."""
from relay.cli.group import entry, main  # noqa: F401
