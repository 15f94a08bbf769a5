"""What every verb of the command line shares: the Context (the project found, its configuration
and ledger), logging, the JSON and verdict printers, and the Group that prints click's errors
through the terminal's gate. No verb is defined here, and nothing here imports a verb."""
import datetime
import functools
import io
import logging
import sys
from pathlib import Path

import click

from relay import config as config_mod
from relay.errors import NotFound, NotInProject, RelayError
from relay.ledger.history import BadRow, History
from relay.files.layout import Layout
from relay.ledger.ledger import Ledger
from relay.operator import views
from relay.terminal import echo, echo_json, escaped, json_text

EXIT_LEFT = 3       # run --once finished but left files that made no progress (held open, changing)

log = logging.getLogger("relay")


class JsonFormatter(logging.Formatter):
    FIELDS = (("relay_id", "id"), ("relay_from", "from"), ("relay_to", "to"), ("relay_event", "event"))

    def format(self, record):
        doc = {"ts": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(),
               "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage()}
        for attr, key in self.FIELDS:       # a line about one message (work.fields) carries them
            if hasattr(record, attr):
                doc[key] = getattr(record, attr)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json_text(doc)


class TextFormatter(logging.Formatter):
    """A log line as people read it, through the terminal's gate (terminal.py): a name or a
    reason that holds an escape is shown escaped."""

    def format(self, record):
        return escaped(super().format(record))


def setup_logging(cfg, quiet=False):
    # Neither format shows the caller's file, thread or process: not gathered for each record
    # (the logging HOWTO's "Optimization"), which halves what a line costs the daemon.
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    if cfg.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(message)s"))
    root = logging.getLogger("relay")
    root.handlers[:] = [handler]
    root.setLevel("WARNING" if quiet else cfg.log_level)
    root.propagate = False


def fail(message):
    raise click.ClickException(message)


_WARNED = set()     # configuration warnings already printed by this process


def warn(cfg, say=None):
    """Print each of the configuration's warnings once per process (stderr, or `say`)."""
    for w in cfg.warnings:
        if w not in _WARNED:
            _WARNED.add(w)
            # relay.toml and the environment's names may hold anything: no control character is written
            (say or (lambda text: echo(f"relay: warning: {text}", err=True)))(views.plain(w))


class Context:
    def __init__(self, root, state_dir, overrides=None):
        self.root, self.state_dir = root, state_dir
        self.overrides = overrides or {}
        self.new_project = False    # relay init: the current directory when no project is found
        # Only the verbs that act by the configuration (run, sweep) turn it on: for every other
        # verb a mistake in relay.toml is a warning, and the key is left out.
        self.strict = False
        self.logged = False     # run: the warnings go to the log instead
        self._cfg = None

    def load(self):
        """The configuration read afresh, as this verb reads it, of the project found from the
        current directory (config.discover) unless --root or RELAY_ROOT names one."""
        try:
            root = config_mod.discover(self.root, self.state_dir)
        except NotInProject as e:
            # relay init makes a project in the current directory, unless another user's
            # state directory is right there (above it, the new one is nearer and wins).
            if not self.new_project or (e.foreign is not None and e.foreign == Path.cwd().absolute()):
                raise
            root = None
        return config_mod.load(root, self.state_dir, overrides=self.overrides, strict=self.strict)

    @property
    def cfg(self):
        if self._cfg is None:
            self._cfg = self.load()
            if not self.logged:
                warn(self._cfg)
        return self._cfg

    @property
    def layout(self):
        return Layout(self.cfg.root, self.cfg.state_dir)

    def reader(self):
        """The ledger's history, read-only (works beside a running daemon)."""
        path = self.layout.ledger
        if not path.exists():
            raise RelayError(f"no ledger at {path}: run `relay init` (or `relay run`) in the project first")
        return History(Ledger(path, readonly=True))


    def writer(self):
        path = self.layout.ledger
        if not path.exists():
            raise RelayError(f"no ledger at {path}: run `relay init` (or `relay run`) in the project first")
        return Ledger(path, durability=self.cfg.durability)


_pass_context = click.make_pass_decorator(Context)


def pass_ctx(fn):
    """Pass the Context, and accept --root/--state-dir after the verb too
    (`relay run --state-dir .agent-relay`), overriding any given before it."""
    @click.option("--state-dir", "state_dir_", help="State directory, relative to the root (as before the verb).")
    @click.option("--root", "root_", type=click.Path(file_okay=False), help="Project root (as before the verb).")
    @_pass_context
    @functools.wraps(fn)
    def wrapper(ctx, *args, root_=None, state_dir_=None, **kwargs):
        if root_:
            ctx.root = root_
        if state_dir_:
            ctx.state_dir = state_dir_
        return fn(ctx, *args, **kwargs)
    return wrapper


def out_json(doc):
    echo_json(doc, indent=True)


class Said(click.ClickException):
    """A ClickException said relay's way: click's lines (a usage error's usage and hint too), its
    error line starting `relay: ` where click writes `Error: `, as every other line of relay's
    on stderr starts; the exit status is the error's own (1, 2 for a usage error)."""

    def __init__(self, error):
        super().__init__(error.format_message())
        self.error, self.exit_code = error, error.exit_code

    def show(self, file=None):
        told = io.StringIO()
        self.error.show(told)
        said = self.error.format_message()
        click.echo(told.getvalue().replace(f"Error: {said}", f"relay: {said}"), file=file, err=True, nl=False)


def said(error):
    """`error` (a ClickException) to raise again: its message through the terminal's gate, on one
    line, and said relay's way."""
    if isinstance(error, Said):
        return error
    error.message = escaped(error.message, keep="")
    return Said(error)


class Group(click.Group):
    """relay's click group: an error line (a ClickException, relay's own turned into one by
    arguments.handle_errors, or click's usage errors, the group's own options' too) goes out
    through the terminal's gate, on one line, starting `relay: ` (Said)."""

    def make_context(self, *args, **kwargs):
        try:
            return super().make_context(*args, **kwargs)
        except click.ClickException as e:
            raise said(e) from None

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.ClickException as e:
            raise said(e) from None


def verdict(as_json, problems, extra, summary):
    """Print one line per problem and a summary (or JSON); exit 1 when there is a problem."""
    if as_json:
        out_json({"ok": not problems, "problems": problems, **extra})
    else:
        for p in problems:
            echo(p)
        echo(summary)
    if problems:
        sys.exit(1)


def one_row(row, table, missing):
    """`row` of `table` as read for one verb: NotFound(`missing`) when there is none, RelayError
    naming each column this build cannot read when it is damaged."""
    if row is None:
        raise NotFound(missing)
    bad = BadRow.of(row, table)
    if bad is not None:
        raise RelayError(str(bad).replace("; skipped", ""))
    return row
