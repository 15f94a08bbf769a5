"""The two sides of a sustained-load run outside the daemon (relay/sustained.py drives them):
`produce`, a producer process writing messages the way agents do, and `Arrivals`, the thread
that sees each envelope linked into an inbox's new/. Both on a bare inotify descriptor. And
`offer`, both in one for `relay bench`'s latency run."""
import ctypes
import ctypes.util
import json
import marshal
import os
import select
import struct
import threading
import time

IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE, IN_Q_OVERFLOW = 0x40, 0x80, 0x100, 0x200, 0x4000


class Inotify:
    """A bare inotify descriptor (ctypes): watches added by path, events read as (wd, mask, name)."""

    def __init__(self):
        self.libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.poll = select.poll()
        self.poll.register(self.fd, select.POLLIN)

    def add(self, path, mask):
        wd = self.libc.inotify_add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"inotify_add_watch {path}: {os.strerror(e)}")
        return wd

    def read(self, timeout_ms):
        """The events there are, waiting up to `timeout_ms` for the first."""
        if not self.poll.poll(timeout_ms):
            return []
        try:
            buf = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return []
        events, off = [], 0
        while off < len(buf):
            wd, mask, _, size = struct.unpack_from("iIII", buf, off)
            events.append((wd, mask, buf[off + 16:off + 16 + size].rstrip(b"\0")))
            off += 16 + size
        return events

    def close(self):
        os.close(self.fd)


# -- the producers (each in a process of its own) -----------------------------------------

def _wait_while_parent(event, parent):
    """Wait for `event` as long as the process that started this one lives (it may have been
    killed: an orphan must not wait for ever). True if it was set."""
    while not event.wait(0.5):
        if os.getppid() != parent:
            return False
    return True


def produce(k, boxes, rate, offset, seconds, cap, body, out, ready, go, start, done=None, release=None):
    """Producer `k`: message i goes from boxes[i % len][0] to boxes[i % len][1]. At `rate`
    msg/s (this producer's share; slot i at start + offset + i / rate, so the producers
    interleave), or as fast as it can when rate is None, until `seconds` after the start. With
    `cap`, a box holding `cap` waiting files is written to again only once the daemon has taken
    half of them (seen by inotify: the daemon renames each file it takes out of the outbox, so
    the producer waits without using the CPU, and refills in a burst). Writes (names, rename times, its CPU seconds,
    seconds held by the cap) to `out`, then says so on `done` (a semaphore) and stays until
    `release` is set: twenty processes exiting at once take the CPU, and must not do it while
    the last messages are still being measured. It leaves without it if the measuring process
    is gone."""
    parent = os.getppid()
    n_boxes = len(boxes)
    waiting = [0] * n_boxes     # per box: written and not yet taken
    ino = Inotify() if cap else None
    wds = {ino.add(box, IN_MOVED_FROM | IN_DELETE): b for b, (box, _) in enumerate(boxes)} if cap else {}
    names, times, held = [], [], 0.0
    ready.wait()
    if not _wait_while_parent(go, parent):
        return
    t0 = start.value
    end = t0 + seconds
    i = 0
    cpu0 = time.process_time()
    while True:
        if rate:
            due = t0 + offset + i / rate
            if due >= end:
                break
            delay = due - time.time()
            if delay > 0:
                time.sleep(delay)
        elif time.time() >= end:
            break
        b = i % n_boxes
        box, to = boxes[b]
        if cap and waiting[b] >= cap:
            t_hold = time.time()
            while waiting[b] > cap // 2 and time.time() < end:     # then a burst: fewer wake-ups
                for wd, _, name in ino.read(max(1, min(50, int((end - time.time()) * 1000)))):
                    if wd in wds and name and not name.startswith(b"."):
                        waiting[wds[wd]] -= 1
            held += min(time.time(), end) - t_hold
            if waiting[b] > cap // 2:
                break
        name = f"m{k}-{i}"
        tmp = f"{box}/.{name}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, b"TO: %s\nSUBJECT: load %d-%d\n\n%s" % (to.encode(), k, i, body))
        os.close(fd)
        times.append(time.time())
        os.rename(tmp, f"{box}/{name}")
        names.append(name)
        waiting[b] += 1
        i += 1
    if ino is not None:
        ino.close()
    with open(out, "wb") as f:
        marshal.dump((names, times, time.process_time() - cpu0, held), f)
    if done is not None:
        done.release()
    if release is not None:
        _wait_while_parent(release, parent)


# -- what arrives in the inboxes ------------------------------------------------------------

class Arrivals:
    """inotify on every inbox new/ directory: the first instant each name appeared there."""

    def __init__(self, dirs):
        self.ino = Inotify()
        try:
            for d in dirs:
                self.ino.add(d, IN_CREATE | IN_MOVED_TO)
        except OSError:
            self.ino.close()
            raise
        self.seen = {}
        self.overflows = 0
        self.stopping = False
        self.thread = threading.Thread(target=self._read, name="arrivals", daemon=True)
        self.thread.start()

    def _read(self):
        try:    # a higher priority than the producers': the instants are read as events come
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), -10)
        except OSError:
            pass
        seen = self.seen
        while not self.stopping:
            events = self.ino.read(100)
            t = time.time()
            for _, mask, name in events:
                if mask & IN_Q_OVERFLOW:
                    self.overflows += 1
                if name and name not in seen:
                    seen[name] = t

    def close(self):
        self.stopping = True
        self.thread.join()
        self.ino.close()


def offer(count, rate, route, inboxes, patience, start=0, alive=lambda: True):
    """Offer `count` messages at `rate` per second, each written the agents' way (a dot-tmp file
    renamed in); `route(i)` gives message i's outbox directory and recipient (i counts from
    `start`: each message of a run has its own name and token). A watcher of
    `inboxes` (the recipients' new/: loadgen.Arrivals, one thread that stamps each inotify
    event as it reads it) notes when each envelope appears; wait up to `patience` seconds for
    all, while `alive()` (the daemon's). Returns the latencies in ms, from each rename to its
    envelope seen."""
    arrivals = Arrivals(inboxes)
    sent, tokens = {}, {}       # token -> instant renamed; envelope name seen -> its token

    def token(name):
        for new in inboxes:
            try:
                return int(json.loads((new / os.fsdecode(name)).read_bytes())["body"].split()[1])
            except (OSError, ValueError, KeyError, IndexError, AttributeError):
                continue
        return None

    def arrived():
        """How many of this call's messages were seen (an envelope of another call's, come late, is not one)."""
        for name in list(arrivals.seen):
            if tokens.get(name) is None:
                tokens[name] = token(name)
        return sum(1 for t in tokens.values() if t in sent)
    try:
        t0 = time.time()
        for i in range(start, start + count):
            delay = t0 + (i - start) / rate - time.time()
            if delay > 0:
                time.sleep(delay)
            if not alive():
                break
            box, to = route(i)
            tmp = box / f".m{i}.tmp"
            tmp.write_text(f"TO: {to}\n\ntoken {i}")
            sent[i] = time.time()
            os.rename(tmp, box / f"m{i}")
        deadline = time.time() + patience
        while arrived() < count and time.time() < deadline and alive():
            time.sleep(0.05)
    finally:
        arrivals.close()
    arrived()
    return [(arrivals.seen[name] - sent[i]) * 1000 for name, i in tokens.items() if i in sent]
