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
