"""Connections to the team's server: a plain Redis URL (redis:// or rediss:// with its TLS
parameters), Sentinel (redis+sentinel://, following the master through a failover), or a Redis
Cluster (redis+cluster://, any of its nodes: the client follows MOVED and ASK; every key of a
team lies in one hash slot).

A client made with a `limit` reads no reply whole before knowing its size: the parser checks the
length each bulk string announces before reading it, and the total of one reply, and gives up on
the connection (raising ReplyTooLarge) instead of reading past either. This is how a receiver is
kept within its memory bound by whatever another node puts in its stream.

`redis` is imported here only when a `[federation]` section exists.
"""
import logging
import re
import urllib.parse

from relay.errors import FederationError

log = logging.getLogger(__name__)

EXTRA = ("the federation needs the redis package: pip install 'agent-outbox-relay[federation]' "
         "(from a checkout of relay: pip install '.[federation]')")
SOCKET_TIMEOUT = 5.0
CONNECT_TIMEOUT = 2.0


def redis_module():
    """The `redis` package, or FederationError saying which extra to install."""
    try:
        import redis
    except ImportError:
        raise FederationError(EXTRA) from None
    return redis


NO_URL = ("no federation url here: the daemon's environment holds it (RELAY_FEDERATION_URL), or "
          "[federation] url in relay.toml; agents' verbs need none")


def server_errors():
    """What a call to the server may raise when the server (or the way to it) fails: redis-py's
    errors, and a cluster client's own."""
    redis = redis_module()
    try:
        from redis.exceptions import RedisClusterException
    except ImportError:
        return (redis.RedisError,)
    return (redis.RedisError, RedisClusterException)


def reason(error):
    """One line for a Redis error (without the client's own description redis-py puts in some,
    as in "No master found for 'mymaster' : <redis.client.Redis(<...ConnectionPool(...)>)>")."""
    text = " ".join(str(error).split()) or type(error).__name__
    text = text.split(" : <redis.", 1)[0].split(" <redis.", 1)[0]
    return f"{type(error).__name__}: {text}"[:300]


class ReplyTooLarge(Exception):
    """A reply announced a bulk string over the client's limit, more bytes in all than its
    budget, or an entry of more fields than an entry has: the connection is dropped unread.
    `size` is what was announced (bytes, or fields for `what` "fields")."""

    def __init__(self, size, limit, seen=(), what="bytes", key=None):
        if what == "fields":
            text = f"an entry of {size} fields announced, over the {limit} a relay entry may have"
        else:
            text = f"a reply of {size} bytes announced, over the limit of {limit}"
        super().__init__(text)
        self.size = size
        self.limit = limit
        self.what = what
        self.seen = list(seen)      # the small bulk strings read before (an entry's id, its first fields)
        self.key = key              # the stream whose entries were being read (a read of several), or None


def each(client, names, command):
    """`command(pipe, name)` for each of `names` in one round trip: each reply, or the error it
    answered. A reply too large (a guarded client) drops the connection: the names are then
    asked one by one, each too large alone a ReplyTooLarge."""
    if not names:
        return []
    pipe = client.pipeline(transaction=False)
    for n in names:
        command(pipe, n)
    try:
        return pipe.execute(raise_on_error=False)
    except ReplyTooLarge:
        results = []
        for n in names:
            one = client.pipeline(transaction=False)
            command(one, n)
            try:
                results.append(one.execute(raise_on_error=False)[0])
            except ReplyTooLarge as e:
                results.append(e)
        return results


# A stream entry as the server sends it: a pair of its id ("<ms>-<seq>") and its fields.
ENTRY_ID = re.compile(rb"[0-9]{1,20}-[0-9]{1,20}\Z")
ENTRY_FIELDS = 16       # fields of one entry at most (relay writes 4: v, id, to, env)


def _guarded_parser(limit, budget):
    from redis._parsers import _RESP2Parser

    class Guarded(_RESP2Parser):
        """Every bulk's header, and every array's, is peeked at before the parent reads what it
        announces: the bytes counted are the wire's (headers included, so a million empty fields
        count), and an entry's fields are counted before one is read."""

        def read_response(self, disable_decoding=False, **kwargs):
            self.read = 0
            self.seen = []
            self.key = None
            self.fields_next = False
            return super().read_response(disable_decoding=disable_decoding, **kwargs)

        def _read_response(self, disable_decoding=False, **kwargs):
            start = self._buffer.get_pos()
            line = self._buffer.readline(**kwargs)
            self._buffer.rewind(start)
            self.read += len(line) + 2
            fields, self.fields_next = self.fields_next, False
            if line[:1] == b"*" and line != b"*-1":
                count = int(line[1:])
                if fields and count > 2 * ENTRY_FIELDS:       # a name and a value each
                    raise ReplyTooLarge(count // 2, ENTRY_FIELDS, self.seen, what="fields", key=self.key)
                if count == 2 and not fields:
                    return self._pair(disable_decoding, kwargs)
            elif line[:1] == b"$" and line != b"$-1":
                size = int(line[1:])
                self.read += size + 2
                if size > limit:
                    raise ReplyTooLarge(size, limit, self.seen, key=self.key)
                if self.read > budget:
                    raise ReplyTooLarge(self.read, budget, self.seen, key=self.key)
                value = super()._read_response(disable_decoding=disable_decoding, **kwargs)
                if len(self.seen) < 16 and size <= 256:
                    self.seen.append(value)
                return value
            if self.read > budget:
                raise ReplyTooLarge(self.read, budget, self.seen, key=self.key)
            return super()._read_response(disable_decoding=disable_decoding, **kwargs)

        def _pair(self, disable_decoding, kwargs):
            """A two-element array, read here so that an entry's fields (the array after an id)
            are known as such before their count is trusted, and a stream's name (before its
            entries, in a read of several) is known when one is too large."""
            self._buffer.readline(**kwargs)
            first = self._read_response(disable_decoding=disable_decoding, **kwargs)
            raw = first.encode() if isinstance(first, str) else first
            self.fields_next = isinstance(raw, bytes) and ENTRY_ID.match(raw) is not None
            if isinstance(raw, bytes) and not self.fields_next:
                self.key = raw.decode("utf-8", "replace")
            second = self._read_response(disable_decoding=disable_decoding, **kwargs)
            return [first, second]
    return Guarded


def pooled(pool, command):
    """A connection of `pool` for `command` (by its name)."""
    try:
        return pool.get_connection()
    except TypeError:           # redis-py before 5.3 asks for the command's name
        return pool.get_connection(command)


def round_trip(client, commands):
    """The replies to `commands` (tuples of a command's words), sent together on one connection
    and read in order: each reply, or the error the server answered for that one. A pipeline
    without redis-py's Pipeline (whose own cost, per call, is several times the round trip's
    on loopback). A cluster's client uses its pipeline (it routes each key). A connection
    error is raised (the connection dropped): nothing read is trusted."""
    if not commands:
        return []
    if hasattr(client, "get_node_from_key"):
        pipe = client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return pipe.execute(raise_on_error=False)
    redis = redis_module()
    pool = client.connection_pool
    conn = pooled(pool, str(commands[0][0]))
    try:
        conn.send_packed_command(conn.pack_commands(commands))
        out = []
        for _ in commands:
            try:
                out.append(conn.read_response())
            except redis.ResponseError as e:
                out.append(e)
        return out
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


def unread(error, mid=b""):
    """The fields an entry refused unread stands for: the size (or fields) its reply announced,
    what was over the bound ("bytes" or "fields"), the error's words, and its message id when
    they were seen before the bound."""
    return {"oversize": error.size, "what": error.what, "why": str(error), b"id": mid}


def sized(client, key, after, count):
    """Up to `count` entries of a stream after `after`, one by one through a guarded client: each
    (entry id, fields), or (entry id, unread(...)) for one over the client's bound, whose content
    is never read past the size its bulk announced."""
    out = []
    for _ in range(count):
        start = "(" + after if after not in ("0", "0-0") else "-"
        try:
            got = client.xrange(key, start, "+", count=1)
        except ReplyTooLarge as e:
            seen = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in e.seen]
            if not seen:
                raise
            eid, fields = seen[0], seen[1:]
            mid = next((fields[i + 1] for i in range(0, len(fields) - 1, 2) if fields[i] == "id"), "")
            out.append((eid, unread(e, mid.encode())))
            after = eid
            continue
        if not got:
            break
        eid, fields = got[0]
        eid = eid.decode() if isinstance(eid, bytes) else eid
        out.append((eid, fields))
        after = eid
    return out


class Skipping:
    """Streams another node made unreadable (a key of another type: WRONGTYPE) are left out of
    the reads of all the others for a while, said once, and tried again after SKIP seconds: one
    node's key never stops the reading of every node's."""
    SKIP = 30.0

    def __init__(self, what):
        self.what = what
        self.until = {}             # key -> (when it is tried again, why)

    def usable(self, client, streams, now):
        return {k: v for k, v in streams.items() if self.until.get(k, (0.0, None))[0] <= now}

    def found(self, client, streams, now, error):
        """After an error of a read of several streams: which of them fails alone. True when
        one was found (then left out), False when the error is not one stream's."""
        if "WRONGTYPE" not in str(error):
            return False
        bad = False
        for key, cursor in streams.items():
            try:
                client.xread({key: cursor}, count=1)
            except Exception as e:  # noqa: BLE001 - this key's own error, said once
                if "WRONGTYPE" not in str(e):
                    continue
                if key not in self.until:
                    log.error("federation: the %s stream %s is not a stream (%s); left out for %.0fs at a time",
                              self.what, key, reason(e), self.SKIP)
                self.until[key] = (now + self.SKIP, reason(e))
                bad = True
        return bad


def _options(url):
    """redis-py keyword arguments from the URL's query that redis-py does not take itself
    (Sentinel's), and the URL without them."""
    parts = urllib.parse.urlsplit(url)
    return parts, dict(urllib.parse.parse_qsl(parts.query))


def connect(federation, timeout=SOCKET_TIMEOUT, limit=None, budget=None, name=None):
    """A client of the team's server. Commands fail fast (no hidden retries): the callers back
    off themselves. With `limit`, no bulk string over `limit` bytes and no reply over `budget`
    is read (ReplyTooLarge)."""
    redis = redis_module()
    if federation.url is None:
        raise FederationError(NO_URL)
    options = {"socket_timeout": timeout, "socket_connect_timeout": min(timeout, CONNECT_TIMEOUT),
               "retry": None, "retry_on_timeout": False,
               "client_name": name or f"relay-{federation.node}"}
    if limit is not None:
        options["parser_class"] = _guarded_parser(limit, budget or 8 * limit)
        options["protocol"] = 2
    try:
        if federation.sentinel:
            return _sentinel(redis, federation, options)
        if federation.cluster:
            return _cluster(federation, options)
        return redis.Redis.from_url(federation.url, **options)
    except (ValueError, TypeError) as e:
        raise FederationError(f"the federation url {federation.shown_url} cannot be used: {e}") from None


def _cluster(federation, options):
    """A Redis Cluster client: made by reading the cluster's slots and command table at once.
    A cluster that cannot be reached yet gives a client made at its first use (its callers
    retry as with any server away); one that refuses (a wrong password, an ACL user without
    `cluster|slots` and `command`, which `relay federation acl` gives, a server that is no
    cluster) is a FederationError saying so."""
    from redis.cluster import RedisCluster
    scheme, rest = federation.url.split("://", 1)
    options.pop("retry")

    def make():
        return RedisCluster.from_url(scheme.split("+")[0] + "://" + rest, **options)
    try:
        return make()
    except server_errors() as e:
        cause = e.__cause__ or e.__context__
        redis = redis_module()
        if isinstance(cause or e, (redis.ConnectionError, redis.TimeoutError)) and \
                not isinstance(cause or e, redis.AuthenticationError):
            return Later(make)
        more = f" ({reason(cause)})" if cause is not None and not isinstance(cause, (ValueError, TypeError)) else ""
        hint = ("; its ACL user needs +cluster|slots and +command (`relay federation acl` prints them)"
                if isinstance(cause or e, redis.ResponseError) or "not enabled" in str(e) else "")
        raise FederationError(f"the Redis Cluster at {federation.shown_url} cannot be used: {reason(e)}{more}"
                              f"{hint}") from None


class Later:
    """A client made at its first use (`make()`), by whichever call comes first: until then
    every call tries to make it, and raises what making it raised."""

    def __init__(self, make):
        self._make, self._client = make, None

    def __getattr__(self, name):
        if self._client is None:
            self._client = self._make()
        return getattr(self._client, name)

    def close(self):
        if self._client is not None:
            self._client.close()


def _sentinel(redis, federation, options):
    """redis+sentinel://[user:password@]host:port[,host:port...]/service[/db][?options]: the
    master of `service` as the Sentinels name it now, found again after a failover."""
    from redis.sentinel import Sentinel
    parts, query = _options(federation.url)
    hosts = []
    for item in parts.netloc.rsplit("@", 1)[-1].split(","):
        host, _, port = item.rpartition(":") if ":" in item else (item, "", "26379")
        hosts.append((host.strip("[]"), int(port or 26379)))
    path = [p for p in parts.path.split("/") if p]
    if not path:
        raise ValueError("a Sentinel URL names the master's service: redis+sentinel://host:26379/mymaster")
    service, db = path[0], int(path[1]) if len(path) > 1 else 0
    user = urllib.parse.unquote(parts.username) if parts.username else None
    password = urllib.parse.unquote(parts.password) if parts.password else None
    tls = {k: v for k, v in query.items() if k.startswith("ssl")}
    if tls:
        tls = {"ssl": True, **{k: v for k, v in tls.items() if k != "ssl"}}
    sentinel_auth = {}
    if query.get("sentinel_password"):
        sentinel_auth = {"password": query["sentinel_password"], "username": query.get("sentinel_username")}
    sentinel = Sentinel(hosts, sentinel_kwargs={"socket_timeout": options["socket_timeout"], **sentinel_auth},
                        socket_timeout=options["socket_timeout"],
                        socket_connect_timeout=options["socket_connect_timeout"])
    kwargs = {k: v for k, v in options.items() if k not in ("socket_timeout",)}
    return sentinel.master_for(service, db=db, username=user, password=password,
                               socket_timeout=options["socket_timeout"], **{**kwargs, **tls})
