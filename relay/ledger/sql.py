"""What every part of the ledger writes its statements with: the bound on a statement's host
parameters, and the chunks a long list of them is taken in (sqlite-utils' SQLITE_MAX_VARS and
chunks), and the statements that write a batch's many rows in one (insert_rows, with_rows)."""
import sqlite3

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


def _runs(db, rows, width, spare=0):
    """Runs of `rows` (tuples of `width` values), each as many as one statement's host
    parameters hold on this connection (its SQLITE_LIMIT_VARIABLE_NUMBER, less `spare` for the
    statement's other parameters): a batch is one run wherever SQLite allows 32,766."""
    room = db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) - spare
    size = max(1, room // width)
    for i in range(0, len(rows), size):
        yield rows[i:i + size]


def insert_rows(db, head, rows, tail="", row=None):
    """`head VALUES (...), (...), ... tail` for every row of `rows` (tuples of one width), in as
    few statements as the connection's bound on parameters allows (one for a batch): what
    executemany does with one statement per row. `row` is a row's VALUES term when it is more
    than its parameters (`(?, ?, substr(?, 1, 4096))`). Returns the rows changed."""
    rows = list(rows)
    if not rows:
        return 0
    width = len(rows[0])
    row = row or f"({', '.join('?' * width)})"
    changed = 0
    for run in _runs(db, rows, width):
        changed += db.execute(f"{head} VALUES {', '.join([row] * len(run))} {tail}",
                              [value for r in run for value in r]).rowcount
    return changed


def with_rows(db, columns, rows, statement, params=()):
    """One statement for many rows, each with its own values: `WITH v(columns) AS (VALUES (...),
    ...) statement`, where `statement` (`UPDATE messages SET ... FROM v WHERE messages.id =
    v.id`, `INSERT ... SELECT ... FROM v`) reads each row's values as v's columns and `params`
    are its own parameters, after the rows'. In as few statements as the connection's bound on
    parameters allows (one for a batch); an UPDATE's key is in `rows` once. Returns the rows
    changed."""
    rows = list(rows)
    if not rows:
        return 0
    width = len(columns.split(","))
    row = f"({', '.join('?' * width)})"
    changed = 0
    for run in _runs(db, rows, width, spare=len(params)):
        changed += db.execute(f"WITH v({columns}) AS (VALUES {', '.join([row] * len(run))}) {statement}",
                              [*(value for r in run for value in r), *params]).rowcount
    return changed
