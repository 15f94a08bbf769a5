"""The times relay stores and shows: Unix seconds within the calendar years 1 to 9999, the range
a date can be made of (a larger number, infinity or NaN names no day). One place for the bound:
the rows a build can read (ledger/rows.py, ledger/state.py, the SQL of ledger/history.py), the
times a message file may carry (core/message.py) and an imported ledger's (operator/importer.py)."""

FIRST = -62135596800        # 0001-01-01T00:00:00Z
END = 253402300800          # 10000-01-01T00:00:00Z: the first second past the year 9999


def is_time(value):
    """True for a number of seconds within the years 1 to 9999."""
    return isinstance(value, (int, float)) and FIRST <= value < END
