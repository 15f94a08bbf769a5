"""The team's keys on the Redis server, laid out by who writes them, so that Redis ACLs (one user
per node) let each node write only what is its own:

    relay:{team}:node:<N>              hash: N's directory entry (its agents, owner, heartbeat)
    relay:{team}:from:<N>:to:<M>       stream: messages N sends to M (N adds and deletes entries)
    relay:{team}:from:<N>:ack:<M>      stream: N's acknowledgements of what M sent it
    relay:{team}:nodes                 set: the team's registry of node names (the admin's, roster.py)
    relay:{team}:claim:<name>          string: the node that holds an agent name (case folded), written
                                       once with SETNX (claims.py); freed or moved only by the admin

Node N may write `relay:{team}:node:N` and `relay:{team}:from:N:*`, and read every node's entry
and the streams addressed to it (`...:to:N`, `...:ack:N`); the one write it has on another's key
is XDEL of entries it handled in a stream addressed to it, used only when the server is out of
memory. A receiver takes the sending node
from the key it read, never from a field. Node names never hold `:` or a glob character, so a
pattern never matches another node's key. The braces keep every key of a team in one hash slot
(Redis Cluster).
"""
import re

NODE_PREFIX = "node:"
CLAIM_PREFIX = "claim:"
# What an operator writes into the entry of a node gone for good: it lists no name any more, so
# its names may go to the nodes that list them now (relay federation retire).
RETIRED = {"agents": "[]", "v": "retired"}


class Keys:
    def __init__(self, team):
        self.team = team
        self.prefix = f"relay:{{{team}}}:"

    def node(self, name):
        return f"{self.prefix}{NODE_PREFIX}{name}"

    def messages(self, sender, receiver):
        return f"{self.prefix}from:{sender}:to:{receiver}"

    def xadd(self, sender, receiver, mid, recipients, envelope):
        """The XADD that publishes one message (its recipients' JSON, its envelope)."""
        return ("XADD", self.messages(sender, receiver), "*", "v", "2", "id", mid, "to", recipients, "env", envelope)

    def acks(self, receiver, sender):
        """The stream in which `receiver` acknowledges what `sender` sent it."""
        return f"{self.prefix}from:{receiver}:ack:{sender}"

    def claim(self, name):
        """The key of an agent name's claim: one per name, case folded (claims.py)."""
        return f"{self.prefix}{CLAIM_PREFIX}{name.casefold()}"

    @property
    def node_pattern(self):
        return f"{self.prefix}{NODE_PREFIX}*"

    def node_name(self, key):
        """The node a directory key belongs to, or None."""
        key = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
        start = self.prefix + NODE_PREFIX
        return key[len(start):] if key.startswith(start) else None


# What a node runs: its own keys written, the others' read. Nothing else: no FLUSH, no CONFIG,
# no KEYS, no DEL of another's key.
WRITE = ("xadd", "xdel", "xtrim", "xlen", "xrange", "xinfo|stream", "del", "exists", "hset", "hgetall",
         "hget", "hmget", "expire", "pexpire")
READ = ("xread", "xrange", "xlen", "xinfo|stream", "hgetall", "hget", "hmget", "exists",
        "smembers", "scard", "sscan", "sismember",     # the team's registry
        "get", "mget")                                  # the claims
# No scripting: a script could hold the whole server (a loop no node may kill). No SCAN: one call
# with a huge COUNT walks the whole keyspace at once, holding the server as long (nodes are found
# from the team's registry, which the admin keeps: roster.py).
EVERYONE = ("ping", "time", "info", "client|setname", "client|id", "client|info", "hello", "auth",
            "select", "echo",
            "cluster|slots", "cluster|shards", "command",    # a Cluster client reads the slots and command table,
            "asking")                                         # and follows ASK while the team's slot migrates
SAFE = re.compile(r"[^\s'\"\\]+\Z")


def quoted(word):
    """`word` as one argument of a redis-cli line: as it is, or in double quotes with its
    backslashes and double quotes escaped, which redis-cli and a POSIX shell (shlex) read back
    alike (`relay federation acl` refuses a password with a control character or a space)."""
    return word if SAFE.match(word) else '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


# Run by the admin: the retired node's entry lists nothing, and each claim it recorded in its
# entry's `claims` field (the case-folded names it holds) that is still its own is freed.
RETIRE_SCRIPT = ("local n = 0 local c = redis.call('HGET', KEYS[1], 'claims') "
                 "if c then local ok, names = pcall(cjson.decode, c) if ok and type(names) == 'table' then "
                 "for _, name in ipairs(names) do if type(name) == 'string' then "
                 "local k = ARGV[1] .. name if redis.pcall('GET', k) == ARGV[2] then redis.call('DEL', k) n = n + 1 end "
                 "end end end end "
                 "redis.call('HSET', KEYS[1], 'agents', ARGV[3], 'v', ARGV[4]) return n")


def retire(team, node):
    """The redis-cli line with which an operator releases the names of a node gone for good: its
    entry lists nothing, and the claims it holds are freed (one script, run as the admin)."""
    keys = Keys(team)
    words = ["EVAL", RETIRE_SCRIPT, "1", keys.node(node), keys.prefix + CLAIM_PREFIX, node, RETIRED["agents"],
             RETIRED["v"]]
    return " ".join(quoted(w) for w in words)


def claim_free(team, name):
    """The redis-cli line with which the admin frees an agent name: the next node to announce it
    claims it."""
    return " ".join(quoted(w) for w in ["DEL", Keys(team).claim(name)])


def claim_grant(team, name, node):
    """The redis-cli line with which the admin gives an agent name to a node, whoever held it."""
    return " ".join(quoted(w) for w in ["SET", Keys(team).claim(name), node])


def acl(team, node, password=None):
    """The `ACL SETUSER` line that gives one node least privilege (redis-cli syntax). Selectors
    (Redis 7): the root permissions hold what the node writes; one selector holds what it reads."""
    keys = Keys(team)
    user = f"relay-{team}-{node}"
    secret = f">{password}" if password else "><password>"
    own = [f"~{keys.node(node)}", f"~{keys.prefix}from:{node}:*"]
    reads = [f"%R~{keys.node_pattern}", f"%R~{keys.prefix}nodes", f"%R~{keys.prefix}from:*:to:{node}",
             f"%R~{keys.prefix}from:*:ack:{node}", f"%R~{keys.prefix}{CLAIM_PREFIX}*"]
    root = ["on", "resetkeys", "resetchannels", "-@all", *own, *(f"+{c}" for c in WRITE + EVERYONE)]
    selector = "(" + " ".join([*reads, "-@all", *(f"+{c}" for c in READ)]) + ")"
    # What was handled is deleted from the senders' streams when the server is out of memory
    # (an acknowledgement cannot be written then; a deletion needs no memory).
    relief = f"(~{keys.prefix}from:*:to:{node} -@all +xdel)"
    # An agent name is claimed once, by whoever comes first: SETNX alone, no SET, DEL, RENAME,
    # EXPIRE or any other write on a claim (claims.py).
    claims = f"(%W~{keys.prefix}{CLAIM_PREFIX}* -@all +setnx)"
    words = ["ACL", "SETUSER", user, "reset", *root, secret, selector, relief, claims]
    return " ".join(quoted(w) for w in words)


def registration(team, node):
    """The redis-cli line with which the server's admin adds a node to the team's registry (the
    set every node reads to find the others; no node may write it: roster.py)."""
    return " ".join(quoted(w) for w in ["SADD", f"{Keys(team).prefix}nodes", node])


SAVE = "ACL SAVE"       # kept in the server's aclfile, so that a restart keeps every node's user
