"""The window between reading a claimed file in the outbox and taking custody of it (daemon.py:
the claim's log is synced with the envelopes, then each file is renamed into the spool). Whatever
the agent does to its file in that window, the message claimed is the bytes relay read: delivered
once, archived as delivered; what the agent put at the name since is a new message; nothing
outside the state directory is touched. Driven by wrapping Inbox.deliver, which takes custody
through its `custody` callback after the envelopes' sync."""
import os
import stat

import pytest


def before_custody(relay, act):
    """Run `act()` inside the batch, after the files are read and before custody."""
    real = relay.inbox.deliver

    def deliver(works, custody=None):
        act()
        return real(works, custody=custody)

    relay.inbox.deliver = deliver


def bodies(project, agent="Ben"):
    return sorted(e["body"] for e in project.inbox(agent))


def archived(project):
    return sorted(p.read_text() for p in project.files("archive"))


def test_written_again_before_custody_the_bytes_read_are_the_message(project, clock):
    relay = project.relay()
    project.drop("Ann", "msg", "TO: Ben\n\nfirst")
    before_custody(relay, lambda: project.drop("Ann", "msg", "TO: Ben\n\nsecond"))
    assert relay.step().archived == 1
    assert bodies(project) == ["first"] and archived(project) == ["TO: Ben\n\nfirst"]
    assert (project.state / "outbox/Ann/msg").read_text() == "TO: Ben\n\nsecond"   # a new message
    relay.inbox.deliver = type(relay.inbox).deliver.__get__(relay.inbox)
    relay.hint("rescan")
    relay.drain()
    assert bodies(project) == ["first", "second"]
    assert archived(project) == ["TO: Ben\n\nfirst", "TO: Ben\n\nsecond"]
    assert [p for p in (project.state / "spool").rglob("*") if not p.is_dir()] == []


def test_appended_to_in_place_before_custody_the_bytes_read_are_the_message(project):
    relay = project.relay()
    path = project.drop("Ann", "msg", "TO: Ben\n\nfirst")

    def append():
        with open(path, "a") as f:
            f.write(" and more")

    before_custody(relay, append)
    relay.step()
    assert bodies(project) == ["first"] and archived(project) == ["TO: Ben\n\nfirst"]
    assert path.read_text() == "TO: Ben\n\nfirst and more"      # the agent's file, left as it is


def test_hard_linked_out_before_custody_the_archive_holds_relays_own_copy(project, tmp_path):
    relay = project.relay()
    path = project.drop("Ann", "msg", "TO: Ben\n\nfirst")
    outside = tmp_path / "outside-link"
    before_custody(relay, lambda: os.link(path, outside))
    relay.step()
    [kept] = project.files("archive")
    assert kept.read_text() == "TO: Ben\n\nfirst" and bodies(project) == ["first"]
    assert os.stat(kept).st_ino != os.stat(outside).st_ino and os.stat(outside).st_nlink == 1
    with open(outside, "a") as f:                   # the outside name cannot change the archive
        f.write("tampered")
    assert kept.read_text() == "TO: Ben\n\nfirst"


def test_swapped_for_a_link_before_custody_nothing_outside_is_touched(project, tmp_path):
    relay = project.relay()
    path = project.drop("Ann", "msg", "TO: Ben\n\nfirst")
    secret = tmp_path / "secret"
    secret.write_text("TO: Ben\n\nsecret")

    def swap():
        path.unlink()
        path.symlink_to(secret)

    before_custody(relay, swap)
    relay.step()
    assert bodies(project) == ["first"] and archived(project) == ["TO: Ben\n\nfirst"]
    assert secret.read_text() == "TO: Ben\n\nsecret" and path.is_symlink()
    relay.inbox.deliver = type(relay.inbox).deliver.__get__(relay.inbox)
    relay.hint("rescan")
    relay.drain()                                   # the link is a new "message": refused, moved aside
    assert bodies(project) == ["first"] and secret.read_text() == "TO: Ben\n\nsecret"
    assert any("symbolic link" in (r["error"] or "") for r in relay.history.audit())


def test_made_group_writable_before_custody_the_archive_is_not(project):
    relay = project.relay()
    path = project.drop("Ann", "msg", "TO: Ben\n\nfirst")
    before_custody(relay, lambda: os.chmod(path, 0o666))
    relay.step()
    [kept] = project.files("archive")
    assert stat.S_IMODE(os.stat(kept).st_mode) & 0o022 == 0 and bodies(project) == ["first"]


def test_opened_for_writing_before_custody_is_deferred_then_delivered_whole(project, clock):
    relay = project.relay(settle="1s")
    path = project.drop("Ann", "msg", "TO: Ben\n\nfirst")
    held = []
    before_custody(relay, lambda: held.append(open(path, "a")))
    counts = relay.step()
    assert counts.deferred == 1 and project.inbox("Ben") == []
    assert list((project.state / "inbox/Ben/tmp").iterdir()) == []      # its envelope not left
    held[0].write(" and whole")
    held[0].close()
    relay.inbox.deliver = type(relay.inbox).deliver.__get__(relay.inbox)
    relay.drain(wait=clock.advance)
    assert bodies(project) == ["first and whole"] and archived(project) == ["TO: Ben\n\nfirst and whole"]


def test_swapped_between_the_look_and_the_rename_is_read_again(project, clock):
    """A file renamed over the name in the instant between take()'s look and its rename is the
    one moved: it is read again from the spool next time, never delivered as the bytes read."""
    relay = project.relay(retry_backoff="1s")
    path = project.drop("Ann", "msg", "TO: Ben\n\nfirst")
    real = relay.fs.rename

    def rename(src, dst, **k):
        if src == "outbox/Ann/msg" and path.read_text().endswith("first"):
            project.drop("Ann", "msg", "TO: Ben\n\nsecond")
        return real(src, dst, **k)

    relay.fs.rename = rename
    counts = relay.step()
    assert counts.retried == 1 and project.inbox("Ben") == []
    relay.fs.rename = real
    relay.drain(wait=clock.advance)
    assert bodies(project) == ["second"] and archived(project) == ["TO: Ben\n\nsecond"]


@pytest.mark.parametrize("mode", ["fs", "file"])
def test_a_step_failing_at_custody_leaves_it_to_recovery_exactly_once(project, mode):
    """The process dies (a step that raises) right after the envelopes' sync, before any file is
    taken: recovery on the same state directory delivers each message once."""
    relay = project.relay(sync_mode=mode)
    for i in range(3):
        project.drop("Ann", f"m{i}", f"TO: Ben\n\nbody {i}")

    def die():
        raise RuntimeError("killed")

    real = relay.inbox.deliver
    relay.inbox.deliver = lambda works, custody=None: real(works, custody=die)
    with pytest.raises(RuntimeError):
        relay.step()
    relay.close()
    project.relays.remove(relay)
    again = project.relay(sync_mode=mode)
    again.recover()
    again.drain()
    assert bodies(project) == ["body 0", "body 1", "body 2"]
    assert len(project.files("archive")) == 3 and again.history.counts()["archived"] == 3


def test_a_file_that_is_not_regular_is_never_opened(project):
    """A FIFO (or a device an agent could make) in the outbox is refused by its type alone: it
    is neither read before custody nor after (opening a device may act on it)."""
    relay = project.relay()
    os.mkfifo(project.state / "outbox/Ann/pipe")
    opened = []
    real = relay.fs.open_read
    relay.fs.open_read = lambda rel: (opened.append(rel), real(rel))[1]
    relay.hint("rescan")
    relay.drain()
    assert not any(rel.endswith("pipe") for rel in opened)
    assert any("FIFO" in (r["error"] or "") for r in relay.history.audit())


# -- read by a scan's check, before the claim (Outbox.read_ahead) ------------------------------

def before_claim(relay, act):
    """Run `act()` once, after the step's scan has read the files it found, before their claim."""
    real = relay.ledger.register_and_claim

    def claim(*a, **k):
        relay.ledger.register_and_claim = real
        act()
        return real(*a, **k)

    relay.ledger.register_and_claim = claim


def test_read_by_the_scan_then_deleted_before_the_claim_is_delivered_as_read(project):
    relay = project.relay()
    path = project.drop("Ann", "msg", "TO: Ben\n\nfirst")
    before_claim(relay, path.unlink)
    assert relay.step().archived == 1
    assert bodies(project) == ["first"] and archived(project) == ["TO: Ben\n\nfirst"]


def test_read_by_the_scan_then_written_again_before_the_claim_both_are_delivered(project):
    relay = project.relay()
    project.drop("Ann", "msg", "TO: Ben\n\nfirst")
    before_claim(relay, lambda: project.drop("Ann", "msg", "TO: Ben\n\nsecond", in_place=True))
    relay.step()
    assert bodies(project) == ["first"] and archived(project) == ["TO: Ben\n\nfirst"]
    relay.hint("rescan")
    relay.drain()
    assert bodies(project) == ["first", "second"]
    assert archived(project) == ["TO: Ben\n\nfirst", "TO: Ben\n\nsecond"]


def test_files_read_by_a_scan_wait_for_their_claim_and_are_delivered_as_read(project):
    from relay.core.daemon import Relay
    relay = Relay(project.config(agents=["Ann", "Ben"]), clock=project.clock, batch=1)
    project.relays.append(relay)
    for name in ("a", "b", "c"):
        project.drop("Ann", name, f"TO: Ben\n\n{name}")
    relay.step()            # all three found and read, one claimed
    assert len(relay.outbox.read_ahead) == 2
    [(sender, later)] = [k for k in relay.outbox.read_ahead][:1]
    project.drop("Ann", later, "TO: Ben\n\nchanged", in_place=True)
    relay.step()
    relay.step()            # the two others claimed: each delivered as the scan read it
    assert bodies(project) == ["a", "b", "c"] and relay.outbox.read_ahead == {}
    relay.hint("rescan")
    relay.drain()           # what the agent wrote since is a new message
    assert bodies(project) == ["a", "b", "c", "changed"]


def test_a_file_over_the_read_ahead_bound_is_read_at_its_claim(project):
    from relay.core.readahead import FILE as READ_AHEAD_FILE
    relay = project.relay()
    body = "x" * (READ_AHEAD_FILE + 10)
    project.drop("Ann", "big", f"TO: Ben\n\n{body}")
    real = relay.ledger.register_and_claim

    def claim(*a, **k):
        assert relay.outbox.read_ahead == {}
        return real(*a, **k)

    relay.ledger.register_and_claim = claim
    relay.step()
    assert bodies(project) == [body]


def test_a_file_held_open_for_writing_is_not_read_by_the_scan(project):
    relay = project.relay()
    path = project.drop("Ann", "msg", "TO: Ben\n\npartial")
    with open(path, "a") as writer:
        relay.step()
        assert relay.outbox.read_ahead == {} and bodies(project) == []
        writer.write(" and the rest")
    project.clock.advance(5)
    relay.drain()
    assert bodies(project) == ["partial and the rest"]


def test_what_a_scan_reads_ahead_is_bounded_and_given_back_as_claims_take_it(project):
    from relay.core import readahead
    from relay.core.daemon import Relay
    relay = Relay(project.config(agents=["Ann", "Ben"]), clock=project.clock, batch=4)
    project.relays.append(relay)
    bound = 10 * (readahead.COST + 100)
    relay.outbox.read_ahead.limit = bound
    for i in range(30):
        project.drop("Ann", f"m{i:02d}", f"TO: Ben\n\n{i:02d}" + "x" * 80)
    relay.step()
    assert 0 < relay.outbox.read_ahead.held <= bound + readahead.COST + 100
    assert len(relay.outbox.read_ahead) < 30
    while relay.step().claimed:
        assert relay.outbox.read_ahead.held <= bound + readahead.COST + 100
    # every claim took what was read for it, and gave its room back
    assert len(project.inbox("Ben")) == 30 and relay.outbox.read_ahead == {}
    assert relay.outbox.read_ahead.held == 0


def test_bytes_read_ahead_for_a_message_expired_before_its_claim_are_not_a_later_one_at_its_name(project, clock):
    """A scan reads a file ahead for the message registered for it; that message is expired by
    an operator before any claim took it (its file goes to failed/), and the agent writes a new
    file under the same name. The new message is the new file's bytes: what was read ahead
    belongs to the expired message only."""
    from relay.core.daemon import Relay
    from relay.operator.doctor import expire
    relay = Relay(project.config(agents=["Ann", "Ben"]), clock=clock, batch=1)     # one claim per step
    project.relays.append(relay)
    first = project.drop("Ann", "a", "TO: Ben\n\nfirst")
    later = project.drop("Ann", "m", "TO: Ben\n\nold")
    os.utime(first, (clock.now - 20, clock.now - 20))
    os.utime(later, (clock.now - 10, clock.now - 10))
    assert relay.step().claimed == 1                        # both read by the scan, "a" claimed
    [pending] = [r for r in relay.history.audit() if r["status"] == "pending"]
    assert pending["name"] == "m"
    expire(relay.ledger, relay.layout, pending["id"])
    assert not later.exists()
    project.drop("Ann", "m", "TO: Ben\n\nnew")
    relay.hint("file", "Ann", "m")
    for _ in range(3):
        relay.step(clock.advance(1))
    assert bodies(project) == ["first", "new"]
    assert archived(project) == ["TO: Ben\n\nfirst", "TO: Ben\n\nnew"]
    assert relay.history.get(pending["id"])["status"] == "failed"


def test_bytes_read_for_a_file_whose_path_has_a_message_already_are_not_kept(project, clock):
    """A file whose claim could not take it into the spool waits in the outbox for its retry; a
    look at it then reads it, and registers nothing (the path has its message). Those bytes are
    no message's: dropped at once, their room given back, not held until the next full scan."""
    relay = project.relay(retry_backoff="1h")
    project.drop("Ann", "msg", "TO: Ben\n\nx")
    real = relay.fs.rename

    def refuse_the_spool(src, dst, *a, **k):
        if dst.startswith("spool/"):
            raise PermissionError(13, "Permission denied")
        return real(src, dst, *a, **k)

    relay.fs.rename = refuse_the_spool
    assert relay.step().retried == 1
    relay.fs.rename = real
    relay.hint("file", "Ann", "msg")
    assert relay.step(clock.advance(1)).registered == 0
    assert dict(relay.outbox.read_ahead) == {} and relay.outbox.read_ahead.held == 0
    relay.step(clock.advance(7200))                 # the retry, once due
    assert bodies(project) == ["x"]
