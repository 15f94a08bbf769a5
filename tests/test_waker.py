"""The Waker the daemon's loop sleeps in (relay/core/waker.py): a pipe and a flag; a set() racing
with clear() is still a wake-up, and a closed waker touches no descriptor that took its numbers."""
import os

from relay.core.waker import Waker


def test_a_set_whose_byte_lands_after_the_clear_is_a_set():
    """Another thread's set() reads the flag down, the loop's clear() runs (flag down, pipe
    drained), then the thread writes its byte: the flag is down with a byte in the pipe. That
    byte is a wake-up (what the thread hinted came after the clear): wait() says so at once,
    instead of returning False at once, for ever, while the pipe stays readable."""
    w = Waker()
    try:
        os.write(w.w, b"x")             # the late half of a set() that raced with clear()
        assert w.wait(5.0) is True
        assert w.is_set()
        w.clear()
        assert w.wait(0) is False       # cleared for good: nothing left in the pipe
    finally:
        w.close()


def test_a_closed_waker_touches_no_descriptor_that_reuses_its_numbers():
    """Relay.close() closes the waker; a signal handler (SIGHUP while the daemon shuts down) or
    the federation's link thread may still set() it, and a second close() may follow. The pipe's
    numbers are free by then, and the next descriptor opened takes them (the lowest free): set()
    wrote a byte into that file, and a second close() closed it."""
    w = Waker()
    old = (w.r, w.w)
    w.close()
    r2, w2 = os.pipe()                  # the lowest free numbers: the waker's
    try:
        assert {r2, w2} == set(old)
        os.set_blocking(r2, False)      # a clear() that reads it would otherwise hang the test
        w.clear()
        w.set()
        w.close()
        os.write(w2, b"y")              # still open, and nothing but this byte in it
        assert os.read(r2, 16) == b"y"
    finally:
        for fd in (r2, w2):
            try:
                os.close(fd)
            except OSError:
                pass
