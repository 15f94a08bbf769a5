from relay.cli import entry

entry()
