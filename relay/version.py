"""The version of relay (the distribution agent-outbox-relay)."""
__version__ = "0.1.0"
