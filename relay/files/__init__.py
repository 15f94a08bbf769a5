"""The files relay touches, and how: the confined file system (fs.py: every path walked from the
state directory down without following a link, the fsync primitives), the sync discipline that
makes a batch durable before anything refers to it (sync.py), the layout of `.relay/`
(layout.py), the daemon's lock (lock.py) and the paths and globs of file reservations
(patterns.py: normalised inside the project, overlap). Nothing here knows about messages or SQL."""
