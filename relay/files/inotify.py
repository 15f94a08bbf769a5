"""Linux's inotify for relay's own readers (the daemon's watcher, core/watcher.py, and a wait for
mail, agent/mail.py): the C library's inotify_init and inotify_add_watch by ctypes, and the
event masks as watchdog's documented Linux observer module (watchdog.observers.inotify) names
them. Elsewhere, or where the C library has no inotify, `available` is False and both readers
use a watchdog Observer instead. A watchdog release that moves these names fails
tests/test_watcher.py rather than sending relay down the fallback unseen."""
import ctypes

try:
    from watchdog.observers import inotify as watchdog_inotify
except (ImportError, OSError):  # not Linux, or a libc without inotify
    watchdog_inotify = None


def _bind():
    """(inotify_init, inotify_add_watch) of the C library, or (None, None)."""
    if watchdog_inotify is None:
        return None, None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        init, add = libc.inotify_init, libc.inotify_add_watch
    except (OSError, AttributeError):
        return None, None
    init.argtypes, init.restype = [], ctypes.c_int
    add.argtypes, add.restype = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32], ctypes.c_int
    return init, add


inotify_init, inotify_add_watch = _bind()
available = inotify_init is not None
Constants = watchdog_inotify.InotifyConstants if watchdog_inotify is not None else None
# watchdog's move grouper, which its Linux observer holds each IN_MOVED_FROM in (core/watcher.py
# sets its delay to none): None where that observer is not used
MoveEventGrouper = getattr(watchdog_inotify, "InotifyMoveEventGrouper", None)


def errno_now():
    """The errno of the last failed inotify call."""
    return ctypes.get_errno()
