"""What every part of the ledger writes its statements with: the bound on a statement's host
parameters, and the chunks a long list of them is taken in (sqlite-utils' SQLITE_MAX_VARS and
chunks)."""

# Host parameters one statement takes at most. SQLite's own limit is 32,766 since 3.32 and 999
# before; 500 leaves room for a statement's other parameters on either.
SQLITE_MAX_VARS = 500


def chunks(items, size=SQLITE_MAX_VARS):
    """(chunk, marks) for each run of at most `size` of `items`: the run as a list and its
    `?, ?, ...` for an `IN (...)`."""
    items = list(items)
    for i in range(0, len(items), size):
        chunk = items[i:i + size]
        yield chunk, ",".join("?" * len(chunk))
