"""The confined file system (relay/files/fs.py StateDir): it never follows a link, never writes
through a hard link, and a directory it holds open that was swapped since is looked up again,
never used; one not swapped keeps its descriptor."""
import errno
import os

import pytest

from relay.files.fs import StateDir


def test_open_read_never_follows_a_link(tmp_path):
    outside = tmp_path / "outside"
    outside.write_text("secret")
    state = tmp_path / "state"
    state.mkdir()
    (state / "link").symlink_to(outside)
    fs = StateDir(state)
    try:
        with pytest.raises(OSError) as e:
            fs.open_read("link")
        assert e.value.errno == errno.ELOOP
    finally:
        fs.close()


def test_create_never_writes_through_a_hard_link(tmp_path):
    outside = tmp_path / "outside"
    outside.write_text("keep")
    state = tmp_path / "state"
    state.mkdir()
    os.link(outside, state / "planted")
    fs = StateDir(state)
    try:
        fd = fs.create("planted")
        os.write(fd, b"relay's")
        os.close(fd)
    finally:
        fs.close()
    assert outside.read_text() == "keep" and (state / "planted").read_text() == "relay's"


def test_a_cached_directory_swapped_between_steps_is_looked_up_again(tmp_path):
    """recheck() (each step) keeps directory descriptors, but a directory swapped since (for a
    link out, for another directory, or removed and made again) is walked again, never used."""
    open_before = len(os.listdir("/proc/self/fd"))     # what earlier tests left open is not this test's
    outside = tmp_path / "outside"
    (outside / "b").mkdir(parents=True)
    state = tmp_path / "state"
    (state / "a" / "b").mkdir(parents=True)
    fs = StateDir(state)
    try:
        os.close(fs.create("a/b/one"))              # a and a/b cached
        os.rename(state / "a" / "b", tmp_path / "moved-b")  # the cached a/b moved out ...
        (state / "a" / "b").symlink_to(outside / "b")       # ... and a link put in its place
        fs.recheck()
        with pytest.raises(OSError) as e:
            fs.create("a/b/two")
        assert e.value.errno in (errno.ELOOP, errno.ENOTDIR)
        assert not (outside / "b" / "two").exists() and not (tmp_path / "moved-b" / "two").exists()

        (state / "a" / "b").unlink()
        (state / "a" / "b").mkdir()
        fs.recheck()
        os.close(fs.create("a/b/three"))            # the directory there now, not the one moved
        assert (state / "a" / "b" / "three").exists() and not (tmp_path / "moved-b" / "three").exists()

        os.rename(state / "a", tmp_path / "moved-a")        # a parent swapped for another directory
        (state / "a" / "b").mkdir(parents=True)
        fs.recheck()
        os.close(fs.create("a/b/four"))
        assert (state / "a" / "b" / "four").exists() and not (tmp_path / "moved-a" / "b" / "four").exists()

        (state / "a" / "b" / "four").unlink()
        (state / "a" / "b").rmdir()
        (state / "a" / "b").mkdir()                 # removed and made again: another inode
        fs.recheck()
        os.close(fs.create("a/b/five"))
        assert (state / "a" / "b" / "five").exists()
        # every dropped descriptor closed: the state directory, a and a/b are all it holds
        assert len(os.listdir("/proc/self/fd")) <= open_before + 3
    finally:
        fs.close()


def test_a_directory_not_swapped_keeps_its_descriptor_across_steps(tmp_path):
    state = tmp_path / "state"
    (state / "a" / "b").mkdir(parents=True)
    fs = StateDir(state)
    try:
        first = fs.dir("a/b")
        fs.recheck()
        assert fs.dir("a/b") == first and fs.dir("a") == fs._dirs["a"]
    finally:
        fs.close()


def test_a_closed_state_directory_refuses_rather_than_walk_from_a_reused_descriptor(tmp_path):
    """close() left the closed descriptor's number as the walk's top: once the number was reused
    (another state directory opened), the closed one opened and cached directories beneath what
    that number named now, descriptors nothing closed again."""
    (tmp_path / "one" / "a").mkdir(parents=True)
    (tmp_path / "two" / "a").mkdir(parents=True)
    old = StateDir(tmp_path / "one")
    old.close()
    new = StateDir(tmp_path / "two")             # the lowest free number: the one just closed
    try:
        open_before = len(os.listdir("/proc/self/fd"))
        with pytest.raises(OSError) as e:
            old.dir("a")
        assert e.value.errno == errno.EBADF and str(tmp_path / "one") in str(e.value)
        with pytest.raises(OSError):
            old.create("a/file")
        assert not (tmp_path / "two" / "a" / "file").exists() and not (tmp_path / "one" / "a" / "file").exists()
        assert len(os.listdir("/proc/self/fd")) == open_before
        old.close()                                 # closing again is harmless
        assert new.dir("a") > 0
    finally:
        new.close()


def test_put_syncs_the_file_renames_it_into_place_then_syncs_the_directory(tmp_path):
    """A put is durable when it returns: the file's bytes synced before the rename, and the
    directory synced after it (a directory synced before the rename holds the name not yet)."""
    import stat
    (tmp_path / "d").mkdir()
    fs = StateDir(tmp_path)
    seen = []

    def recording(fd):      # the sync put() is given: what the directory holds at each
        kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        seen.append((kind, sorted(p.name for p in (tmp_path / "d").iterdir())))
    try:
        fs.put("d/f", b"whole", fsync=recording)
    finally:
        fs.close()
    assert seen == [("file", [".f.tmp"]), ("dir", ["f"])]
    assert (tmp_path / "d" / "f").read_bytes() == b"whole"


def test_replace_file_syncs_the_file_renames_it_over_the_name_then_syncs_the_directory(tmp_path):
    import stat
    from relay.files.fs import replace_file
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"old")
    seen = []

    def recording(fd):
        kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        seen.append((kind, sorted((p.name.split(".")[1] if p.name.startswith(".") else p.name, p.read_bytes())
                                  for p in (tmp_path / "d").iterdir())))
    replace_file(tmp_path / "d" / "f", b"new", fsync=recording)
    assert seen == [("file", [("f", b"new"), ("f", b"old")]),      # the temporary beside the old file
                    ("dir", [("f", b"new")])]


@pytest.mark.parametrize("size", [1 << 20, (1 << 20) + 1])
def test_a_read_with_a_limit_reads_past_it_when_the_file_is_larger(tmp_path, size):
    """What a bounded read returns tells its caller whether the file was over the limit."""
    (tmp_path / "f").write_bytes(b"x" * size)
    fs = StateDir(tmp_path)
    try:
        assert len(fs.read("f", limit=1 << 20)) == size
    finally:
        fs.close()


@pytest.mark.parametrize("name, why", [("a b.txt", None), ("a~b", None), ("a\xa0b", None), ("a\x1fb", "control"),
                                       ("a\x7fb", "control"), ("a\x9fb", "control"), ("a\udcffb", "not valid UTF-8")])
def test_a_message_name_is_refused_for_control_characters_and_bytes_not_utf8_only(name, why):
    from relay.files.fs import bad_name
    reason = bad_name(name)
    assert reason is None if why is None else why in reason


def test_a_long_name_fits_after_its_id_and_before_the_error_sidecars_suffix():
    """fit() cuts a name so that `<id>--<name>.error.json` (a failed message's report) is a
    file name the file system takes (255 bytes), in UTF-8, and cuts no character in two."""
    from relay.files.layout import fit
    for name in ("a" * 300, "名" * 200, "x" * 214):
        kept = fit(name)
        assert name.startswith(kept) and len(f"{'0' * 26}--{kept}.error.json".encode()) <= 255
    assert fit("short") == "short"


def test_the_outboxes_listed_leave_out_a_plain_file_and_name_why_a_link_a_bad_or_a_reserved_name_is_none(tmp_path):
    from relay.files.layout import Layout
    layout = Layout(tmp_path, tmp_path / ".relay")
    assert layout.init(["Ann", "Ben"]) == []
    box = tmp_path / ".relay" / "outbox"
    (box / "Dee").write_text("a file, not an outbox")
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", box / "Eve")
    (box / "bad name").mkdir()
    (box / "System").mkdir()
    listed = {name: problem for name, _, problem in layout.outbox_dirs()}
    assert "Dee" not in listed
    assert (listed["Ann"], listed["Ben"]) == (None, None)
    assert listed["Eve"] == "a symbolic link; relay never follows links under its state directory"
    assert listed["bad name"].startswith("invalid agent name (must match ")
    assert listed["System"].endswith("; no agent sends as it")
    assert [rel for name, rel, _ in layout.outbox_dirs() if name == "Ann"] == ["outbox/Ann"]


def test_init_makes_no_outbox_for_a_reserved_name_or_a_namesake_in_another_case_and_says_so(tmp_path):
    from relay.files.layout import Layout
    layout = Layout(tmp_path, tmp_path / ".relay")
    assert layout.init(["Ann"]) == []
    problems = layout.init(["ann", "System", "Cy"])
    assert problems == ["'System' is a name relay keeps for itself (System: relay's own name), in any case: no outbox "
                        "or inbox is made for it",
                        "'ann' would be the same as the agent 'Ann' on a case-insensitive file system; use 'Ann': no "
                        "outbox or inbox is made for it"]
    made = sorted(p.name for p in (tmp_path / ".relay" / "outbox").iterdir())
    assert made == ["Ann", "Cy"]
    assert (tmp_path / ".relay" / "inbox" / "Cy" / "new").is_dir() and not (tmp_path / ".relay" / "inbox" / "ann").exists()


def test_replace_file_refuses_a_link_a_directory_and_a_fifo_no_one_reads_and_keeps_a_files_mode(tmp_path):
    from relay.files.fs import Unsafe, replace_file
    target = tmp_path / "target"
    target.write_bytes(b"kept")
    os.symlink(target, tmp_path / "link")
    (tmp_path / "adir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    for name, errno_, said in [("link", errno.ELOOP, "is a symbolic link; relay never writes through one"),
                               ("adir", errno.EINVAL, "is not a regular file; name a file to write"),
                               ("fifo", errno.ENXIO, "is a FIFO no one reads; name a file to write")]:
        with pytest.raises(Unsafe) as e:
            replace_file(str(tmp_path / name), b"new", fsync=lambda fd: None)
        assert e.value.errno == errno_ and said in str(e.value) and str(tmp_path / name) in str(e.value)
    assert target.read_bytes() == b"kept" and (tmp_path / "adir").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "fifo", "link", "target"]   # no temporary left
    target.chmod(0o640)
    replace_file(str(target), b"new", fsync=lambda fd: None)
    assert target.read_bytes() == b"new" and (target.stat().st_mode & 0o777) == 0o640
    replace_file("/dev/null", b"into a device as it is", fsync=lambda fd: None)


def test_a_read_of_what_is_not_a_regular_file_is_refused(tmp_path):
    from relay.files.fs import StateDir, Unsafe
    (tmp_path / "adir").mkdir()
    fs = StateDir(tmp_path)
    with pytest.raises(Unsafe, match="adir is not a regular file"):
        fs.read("adir")


def test_a_state_directory_whose_way_holds_a_plain_file_is_not_made(tmp_path):
    from relay.files.layout import Layout
    (tmp_path / "a").write_text("a file where a directory is named")
    with pytest.raises(NotADirectoryError):
        Layout(tmp_path, tmp_path / "a" / ".relay").create()
    assert (tmp_path / "a").read_text() == "a file where a directory is named"
    made = Layout(tmp_path, tmp_path / "b" / "c" / ".relay").create()
    assert made.state.is_dir() and (tmp_path / "b" / "c").is_dir()


def test_the_known_agents_are_the_outboxes_the_inboxes_and_the_configured_never_a_reserved_name_or_a_link(tmp_path):
    from relay.files.layout import Layout
    layout = Layout(tmp_path, tmp_path / ".relay")
    layout.init(["Ann"])
    state = tmp_path / ".relay"
    (state / "inbox" / "Ben").mkdir()                       # an inbox alone
    (state / "outbox" / "Cy").mkdir()                       # an outbox alone
    (tmp_path / "away").mkdir()
    os.symlink(tmp_path / "away", state / "outbox" / "Dee")
    os.symlink(tmp_path / "away", state / "inbox" / "Eve")
    (state / "outbox" / "a-file").write_text("x")
    (state / "inbox" / "bad name").mkdir()
    assert layout.agent_names(configured=["Zed", "system", "Broadcast"]) == {"Ann", "Ben", "Cy", "Zed"}
    assert "System" not in layout.agent_names()              # its inbox is relay's own


def test_of_outboxes_alike_but_for_case_the_one_with_an_inbox_is_read_and_the_others_are_not(tmp_path):
    from relay.files.layout import Layout
    layout = Layout(tmp_path, tmp_path / ".relay")
    layout.init(["Ann"])
    box = tmp_path / ".relay" / "outbox"
    for name in ("ann", "ANN", "Bob", "bob", "Cy", "cy"):
        (box / name).mkdir()
    (tmp_path / ".relay" / "inbox" / "Cy").mkdir()
    listed = {name: problem for name, _, problem in layout.outbox_dirs()}
    assert (listed["Ann"], listed["Cy"]) == (None, None)
    assert listed["cy"].endswith("move them into outbox/Cy)")
    for name in ("ann", "ANN"):
        assert listed[name].endswith(": relay does not read it (its files stay where they are; move them into "
                                     "outbox/Ann)")
        assert f"'{name}' would be the same as the agent 'Ann'" in listed[name]
    assert (listed["Bob"], listed["bob"]) == (None, None)         # no inbox says which: both read
    assert layout.agent_names() == {"Ann", "Bob", "bob", "Cy"}


def spool_of_ann(tmp_path):
    """A project of Ann's made in `tmp_path`: (its Layout, its spool directory, a message id)."""
    from relay.files.layout import Layout
    layout = Layout(tmp_path, tmp_path / ".relay")
    layout.init(["Ann"])
    return layout, tmp_path / ".relay" / "spool", "01JAAAAAAAAAAAAAAAAAAAAAAA"


def test_the_spool_lists_only_the_files_relay_names_there(tmp_path):
    layout, spool, mid = spool_of_ann(tmp_path)
    (spool / "Ann").mkdir()
    (spool / "Ann" / f"{mid}--msg").write_text("x")
    (spool / "Ann" / f"{mid}--").write_text("no name")
    (spool / "Ann" / "not-an-id--msg").write_text("x")
    (spool / "Ann" / f"{mid}").write_text("no separator")
    (spool / "Ann" / f"{mid}--adir").mkdir()
    (spool / "bad name").mkdir()
    (spool / "bad name" / f"{mid}--msg").write_text("x")
    (spool / "Cy").write_text("a file, not a directory")
    assert list(layout.spooled()) == [("Ann", mid, "msg", f"spool/Ann/{mid}--msg")]


def test_a_file_name_is_kept_whole_up_to_216_bytes_and_cut_between_characters_past_it():
    from relay.files.layout import MAX_NAME, fit, valid_id
    assert MAX_NAME == 216 == 255 - len("01JAAAAAAAAAAAAAAAAAAAAAAA--") - len(".error.json")
    assert fit("n" * 216) == "n" * 216
    assert fit("n" * 217) == "n" * 216
    assert fit("é" * 108) == "é" * 108 and fit("é" * 109) == "é" * 108
    assert fit("n" + "é" * 108) == "n" + "é" * 107
    assert valid_id("01JAAAAAAAAAAAAAAAAAAAAAAA") and not valid_id("01JAAAAAAAAAAAAAAAAAAAAAA")
    assert not valid_id("01jaaaaaaaaaaaaaaaaaaaaaaa") and not valid_id("01JAAAAAAAAAAAAAAAAAAAAAAU")


@pytest.mark.parametrize("rel", ["a/..", "a/.", "a/", "..", ".", "", "a//b", "a/b\0c"])
def test_a_path_that_names_no_file_inside_the_state_directory_is_refused_saying_so(tmp_path, rel):
    from relay.files.fs import Unsafe
    fs = StateDir(tmp_path)
    try:
        with pytest.raises(Unsafe, match="is not a path inside the state directory") as e:
            fs.create(rel, make_parents=True)
        assert e.value.errno == errno.EINVAL
    finally:
        fs.close()
    assert list(tmp_path.iterdir()) == []         # refused before any directory on its way is made


def test_a_name_is_shown_with_its_backslashes_doubled_and_its_undecodable_bytes_and_controls_escaped():
    from relay.files.fs import shown
    assert shown("a\\x41") == "a\\\\x41"              # not to be read as the escape of 'A'
    assert shown("tab\there") == "tab\\x09here" and shown("nl\n") == "nl\\x0a"
    assert shown(b"caf\xe9") == shown(os.fsdecode(b"caf\xe9")) != "caf\xe9"
    assert shown("plain name-1.txt") == "plain name-1.txt"


def test_put_without_a_sync_still_writes_the_whole_file_in_place_of_the_old_and_leaves_no_temporary(tmp_path):
    fs = StateDir(tmp_path)
    try:
        fs.put("d/f", b"first", fsync=False)
        fs.put("d/f", b"second", fsync=False)
    finally:
        fs.close()
    assert (tmp_path / "d" / "f").read_bytes() == b"second" and os.listdir(tmp_path / "d") == ["f"]


@pytest.mark.parametrize("planted", ["link", "file"])
def test_a_directory_on_the_way_that_is_a_link_or_a_file_is_refused_as_unsafe_naming_it(tmp_path, planted):
    from relay.files.fs import Unsafe
    state = tmp_path / "state"
    state.mkdir()
    (tmp_path / "elsewhere").mkdir()
    if planted == "link":
        (state / "d").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    else:
        (state / "d").write_text("a file where a directory goes")
    fs = StateDir(state)
    try:
        for op in (lambda: fs.create("d/f", make_parents=True), lambda: fs.open_read("d/f")):
            with pytest.raises(Unsafe) as e:
                op()
            assert e.value.strerror == ("d is a symbolic link or not a directory; relay never follows links under its "
                                        "state directory")
    finally:
        fs.close()
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_replace_file_makes_a_file_not_there_yet_with_the_umasks_mode(tmp_path):
    from relay.files.fs import replace_file
    old = os.umask(0o027)
    try:
        replace_file(tmp_path / "page.html", b"<p>new</p>", fsync=lambda fd: None)
    finally:
        os.umask(old)
    assert (tmp_path / "page.html").read_bytes() == b"<p>new</p>"
    assert (tmp_path / "page.html").stat().st_mode & 0o777 == 0o640 and os.listdir(tmp_path) == ["page.html"]


@pytest.mark.parametrize("parts", [("a/b", "c"), ("a", ""), ("a", ".."), ("a", "b\0")])
def test_path_parts_given_apart_are_each_checked(parts):
    from relay.files.fs import Unsafe, split
    with pytest.raises(Unsafe, match="is not a path inside the state directory"):
        split(parts)
    assert split(("a", "b")) == ["a", "b"]


def test_a_read_without_a_limit_reads_the_whole_file_and_a_directory_or_fifo_is_refused(tmp_path):
    from relay.files.fs import Unsafe
    (tmp_path / "big").write_bytes(b"x" * (3 << 20))
    (tmp_path / "d").mkdir()
    os.mkfifo(tmp_path / "fifo")
    fs = StateDir(tmp_path)
    try:
        assert fs.read("big") == b"x" * (3 << 20)
        for rel in ("d", "fifo"):
            with pytest.raises(Unsafe) as e:
                fs.read(rel)
            assert e.value.strerror == f"{rel} is not a regular file"
    finally:
        fs.close()


def test_the_known_agents_with_outbox_gone_are_the_inboxes_and_the_configured(tmp_path):
    """outbox/ removed (or not there yet): the names cannot be kept between calls, and the
    inboxes and the configured names are still the known agents."""
    from relay.files.layout import Layout
    layout = Layout(tmp_path, tmp_path / ".relay")
    layout.init(["Ann"])
    state = tmp_path / ".relay"
    (state / "outbox" / "Ann").rmdir()
    (state / "outbox").rmdir()
    (state / "inbox" / "Ben").mkdir()
    assert layout.agent_names(configured=["Zed"]) == {"Ann", "Ben", "Zed"}
    (state / "inbox" / "Cy").mkdir()
    assert layout.agent_names() == {"Ann", "Ben", "Cy"}


def test_what_the_spool_leaves_alone_is_logged_by_its_name(tmp_path, caplog):
    """A file or a link where a sender's spool directory would be, and a file relay did not
    name, are each left alone and logged as such (a link is never followed to be listed)."""
    layout, spool, mid = spool_of_ann(tmp_path)
    (tmp_path / "away").mkdir()
    (tmp_path / "away" / f"{mid}--msg").write_text("x")
    (spool / "Ann").mkdir()
    (spool / "Ann" / "not-an-id--msg").write_text("x")
    (spool / "Cy").write_text("a file, not a directory")
    os.symlink(tmp_path / "away", spool / "Dee")
    with caplog.at_level("WARNING", logger="relay"):
        assert list(layout.spooled()) == []
    assert sorted(r.getMessage() for r in caplog.records) == [
        "spool/Ann/not-an-id--msg is not a file relay made; it is left alone",
        "spool/Cy is not a directory relay made; it is left alone",
        "spool/Dee is not a directory relay made; it is left alone"]


def test_a_listing_is_kept_after_a_tenth_of_a_second_unless_a_directory_keeps_whole_seconds_for_both_times():
    """racy(): (dev, ino, mtime ns, ctime ns) of outbox/ then of inbox/. Whole seconds for one
    of a directory's two times is no coarse clock: only both are."""
    from relay.files.layout import COARSE_RACY, RACY, racy
    frac, whole = 5_250_000_000, 5_000_000_000
    assert (RACY, COARSE_RACY) == (0.1, 2.5)
    assert racy((1, 2, frac, frac, 1, 3, frac, frac)) == RACY
    assert racy((1, 2, whole, frac, 1, 3, frac, whole)) == RACY
    assert racy((1, 2, whole, whole, 1, 3, frac, frac)) == COARSE_RACY
    assert racy((1, 2, frac, frac, 1, 3, whole, whole)) == COARSE_RACY


def test_an_agents_namesake_check_ignores_entries_that_could_be_no_agents_directory(tmp_path):
    """listed(): only directories with valid agent names count as the names a new agent is
    compared with: a fullwidth `ＡＮＮ` directory (no valid name) and a link or a file named
    `ann` do not stop `Ann` from being made."""
    from relay.files.layout import Layout
    layout = Layout(tmp_path, tmp_path / ".relay")
    assert layout.init([]) == []
    state = tmp_path / ".relay"
    (state / "outbox" / "ＡＮＮ").mkdir()
    (tmp_path / "away").mkdir()
    os.symlink(tmp_path / "away", state / "inbox" / "ann")
    (state / "outbox" / "bEN").write_text("a file")
    assert layout.listed() == {"System"}         # relay's own inbox
    assert layout.init(["Ann", "Ben"]) == []
    assert (state / "outbox" / "Ann").is_dir() and (state / "inbox" / "Ben" / "new").is_dir()
