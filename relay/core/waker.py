"""The loop's wake-up flag: set by other threads (the federation's link, a signal's helper,
watchdog's observer) and by the loop itself when it reads file events; waited on by one poll()
beside the inotify descriptor, so that the loop that reads its own file events sleeps in a
single system call. A pipe holds a byte while the flag is set."""
import os
import select


class Waker:
    """threading.Event's set / clear / is_set / wait, plus poll() on other descriptors too."""

    def __init__(self):
        self.r, self.w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._flag = False

    def set(self):
        if not self._flag:
            self._flag = True
            try:
                os.write(self.w, b"x")
            except (BlockingIOError, OSError):
                pass            # a byte is there already, or the waker is closed: the flag says it

    def is_set(self):
        return self._flag

    def clear(self):
        """The flag down and the pipe drained. A set() racing with this leaves the flag up, which
        wait() and poll() look at before they sleep."""
        self._flag = False
        try:
            while os.read(self.r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def wait(self, timeout=None):
        """True when the flag is up, now or within `timeout` seconds."""
        self.poll(timeout)
        return self._flag

    def poll(self, timeout, fds=()):
        """Sleep until the flag is up, one of `fds` is readable or `timeout` (seconds, None: for
        ever) passes; the descriptors of `fds` that are readable."""
        if self._flag:
            return set()
        poller = select.poll()
        if self.r >= 0:                 # closed: the wait lasts its timeout, it does not spin
            poller.register(self.r, select.POLLIN)
        for fd in fds:
            poller.register(fd, select.POLLIN)
        ready = {fd for fd, _ in poller.poll(None if timeout is None else max(0.0, timeout) * 1000)}
        if self.r in ready:
            # A byte in the pipe is a set(), also one whose flag a racing clear() took down
            # before its byte was written: the flag goes up again, so that the caller ends its
            # wait (and the next clear() drains the pipe) instead of polling a readable pipe.
            self._flag = True
        return ready - {self.r}

    def close(self):
        """Close the pipe, once. The numbers are forgotten before they are freed: a later set()
        (a signal during shutdown, another thread) or clear() or close() must not reach the
        descriptors that reuse them."""
        fds, self.r, self.w = (self.r, self.w), -1, -1
        for fd in fds:
            if fd >= 0:
                os.close(fd)
