"""relay report: the page's numbers, the page rendered in a real headless browser, and its writing:
a default file without --html, never through a link, nothing lost when the disk fills or the
directory turns read-only."""
import os
import re
import shutil
import struct
import subprocess
import zlib

import pytest
from click.testing import CliRunner
from conftest import fill_disk
from pyfakefs.fake_filesystem import set_uid

from relay.cli import main
from relay.files.fs import replace_file
from relay.arguments import explain
from relay.operator import report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.fixture
def page(project, tmp_path):
    relay = project.relay(agents=("Ann", "Ben", "Cy"))
    for i in range(3):
        project.drop("Ann", f"a{i}", f"TO: Ben\nTHREAD: plan\n\nhello {i}")
    project.drop("Ben", "b", "TO: Ann, Cy\nTHREAD: plan\n\nreply")
    project.drop("Cy", "c", "TO: Zed\nTHREAD: <b>odd</b>\n\nlost")
    relay.drain()
    out = tmp_path / "report.html"
    r = CliRunner().invoke(main, ["--root", str(project.root), "report", "--html", str(out)])
    assert r.exit_code == 0, r.output
    return out


def cells(html, table):
    body = re.search(rf"<table id=['\"]{table}['\"]>(.*?)</table>", html, re.S).group(1)
    return [[re.sub("<[^>]+>", "", c) for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row)]
            for row in re.findall(r"<tr>(.*?)</tr>", body)]


def test_report_numbers(page):
    html = page.read_text()
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "") and "<script" not in html
    matrix = cells(html, "matrix")
    assert matrix[0] == ["from \\ to", "Ann", "Ben", "Cy", "total"]
    assert ["Ann", "", "3", "", "3"] in matrix and ["Ben", "1", "", "1", "2"] in matrix
    failures = cells(html, "failures")
    assert len(failures) == 2 and failures[1][1:3] == ["Cy", "c"] and "unknown recipient Zed" in failures[1][3]
    assert "&lt;b&gt;odd&lt;/b&gt;" in html and "<b>odd</b>" not in html
    assert re.search(r"<svg id=['\"]hours['\"]", html) and "<title>" in html
    assert re.search(r"<td>plan</td><td class=['\"]n['\"]>4</td>", html)


def test_the_report_headlines_messages_delivered_and_archived_since_as_delivered(page, project):
    """The cards read "0 delivered" for messages delivered and archived: the ledger's state
    `delivered` is the short time before the archive move. The headline counts delivered
    messages (archived since or not); the ledger's states are named apart."""
    from relay.ledger.history import History
    from relay.ledger.ledger import Ledger
    with History(Ledger(project.state / "ledger.sqlite", readonly=True)) as history:
        counts = history.counts()
    assert counts["archived"] >= 4 and counts["delivered"] == 0
    html = page.read_text()
    headline = re.search(r"<div class=['\"]cards['\"] id=['\"]messages['\"]>(.*?)</div>\s*<p", html, re.S).group(1)
    cards = {name: int(n) for n, name in re.findall(r"<b>(\d+)</b>([a-z ]+)</div>", headline)}
    assert cards == {"delivered": counts["archived"], "on the way": counts["pending"], "failed": 1}
    states = re.sub("<[^>]+>", "", re.search(r"<p class=['\"]meta['\"] id=['\"]states['\"]>(.*?)</p>", html).group(1))
    assert states.startswith("ledger states: archived ") and "delivered 0" in states


def test_the_report_and_the_web_overview_render_the_same_parts(project, tmp_path):
    """relay report and relay web's Overview share their templates (relay/operator/templates):
    the headline, failures (by subject, not file name), bounces and sheds read the same in both,
    the web's message ids links to their pages, the report's plain."""
    pytest.importorskip("starlette", reason="the web extra is not installed")
    from webkit import get, server
    relay = project.relay(agents=("Ann", "Ben"))
    project.drop("Ann", "a", "TO: Ben\nSUBJECT: fine\n\nhello")
    project.drop("Ann", "lost-file", "TO: Zed\nSUBJECT: the <i>plan</i>\n\nto nobody")
    relay.drain()
    out = tmp_path / "report.html"
    r = CliRunner().invoke(main, ["--root", str(project.root), "report", "--html", str(out)])
    assert r.exit_code == 0, r.output
    page = out.read_text()
    with server(project.root) as srv:
        overview = get(srv, "/")[2]
    for part in (r'<div class="cards" id="messages">.*?</div>\s*</div>', r'<p class="meta" id="states">.*?</p>',
                 r'<table id="failures">.*?</table>', r'<table id="bounces">.*?</table>',
                 r'<div class="cards" id="shed-counts">.*?</div>\s*</div>'):
        mine, web = re.search(part, page, re.S).group(0), re.search(part, overview, re.S).group(0)
        assert re.sub(r'<a href="/messages/\w+">(.*?)</a>', r"\1", web) == mine, part
    failures = cells(page, "failures")
    assert failures[1][2] == "the &lt;i&gt;plan&lt;/i&gt;" and "lost-file" not in page
    assert "unknown recipient Zed" in cells(page, "bounces")[1][4]
    assert '<a href="/messages/' in re.search(r'<table id="failures">.*?</table>', overview, re.S).group(0)


def _png_pixels(path):
    """A tiny PNG decoder (8-bit RGB/RGBA, non-interlaced): (width, height, rows of bytes, channels)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", chunk[:10])
            assert depth == 8 and color in (2, 6)
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, rows, channels


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium installed (Debian package `chromium`); .ci/run installs it")
def test_report_renders_in_a_headless_browser(page, tmp_path):
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    url = page.as_uri()
    shot = tmp_path / "shot.png"
    subprocess.run([CHROMIUM, *flags, f"--screenshot={shot}", "--window-size=1000,1400", url],
                   capture_output=True, timeout=120, check=True)
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", url], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    matrix = cells(dom, "matrix")
    assert ["Ann", "", "3", "", "3"] in matrix and ["Ben", "1", "", "1", "2"] in matrix
    width, height, rows, ch = _png_pixels(shot)
    assert (width, height) == (1000, 1400)
    bar = bytes((43, 108, 176))             # the hour bars' fill, #2b6cb0
    bar_pixels = sum(row[i:i + 3] == bar for row in rows for i in range(0, len(row), ch))
    dark = sum(1 for row in rows[:200] for i in range(0, len(row), ch) if row[i] < 100)
    assert bar_pixels > 200, "the per-hour chart was not painted"
    assert dark > 500, "no text was painted"


def test_the_page_holds_no_raw_control_or_bidi_character(project, tmp_path):
    relay = project.relay(agents=("Ann", "Ben"))
    project.drop("Ann", "a", "TO: Ben\nTHREAD: t\x1b]8;;https://x/\x1b\\\u202eevil\x9b2J\n\nhello")
    project.drop("Ann", "b", "TO: Nobody\u202e\x9d\nTHREAD: u\u2066\n\nlost")
    relay.drain()
    out = tmp_path / "report.html"
    r = CliRunner().invoke(main, ["--root", str(project.root), "report", "--html", str(out)])
    assert r.exit_code == 0, r.output
    page = out.read_text()
    assert "t\\x1b]8;;https://x/\\x1b\\\\u202eevil\\x9b2J" in page
    assert not [c for c in page if (c < " " and c not in "\n\t") or "\x7f" <= c <= "\x9f"
                or "\u202a" <= c <= "\u202e" or "\u2066" <= c <= "\u2069"]


@pytest.mark.parametrize("plant", ["symlink", "dangling", "hardlink"])
def test_the_page_is_never_written_through_a_planted_link(project, tmp_path, plant):
    project.relay(agents=("Ann",)).drain()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "bashrc").write_text("export SECRET=1\n")
    name = project.root / "report.html"
    if plant == "symlink":
        name.symlink_to(outside / "bashrc")
    elif plant == "dangling":
        name.symlink_to(outside / "created")
    else:
        os.link(outside / "bashrc", name)
    r = CliRunner().invoke(main, ["--root", str(project.root), "report", "--html", str(name)])
    assert (outside / "bashrc").read_text() == "export SECRET=1\n" and sorted(os.listdir(outside)) == ["bashrc"]
    if plant == "hardlink":             # replaced by a new file, the other name's inode untouched
        assert r.exit_code == 0 and "<html" in name.read_text() and not name.is_symlink()
    else:
        lines = r.output.strip().splitlines()
        assert r.exit_code == 1 and len(lines) == 1 and "is a symbolic link" in lines[0], r.output
        assert name.is_symlink()


def test_the_page_to_standard_output_a_fifo_and_a_device(project, tmp_path):
    project.relay(agents=("Ann",)).drain()
    r = CliRunner().invoke(main, ["--root", str(project.root), "report", "--html", "-"])
    assert r.exit_code == 0 and r.stdout.startswith("<!doctype html>") and r.stdout.rstrip().endswith("</html>")
    os.mkfifo(tmp_path / "fifo.html")           # no one reads it: refused at once, not waited on
    r = CliRunner().invoke(main, ["--root", str(project.root), "report", "--html", str(tmp_path / "fifo.html")])
    assert r.exit_code == 1 and "is a FIFO no one reads" in r.output
    r = CliRunner().invoke(main, ["--root", str(project.root), "report", "--html", "/dev/null"])
    assert r.exit_code == 0 and os.path.exists("/dev/null")


# -- the page's writing on a file system laid out by hand (pyfakefs): a disk that fills, a directory
#    made read-only while the page is written (root may write anywhere: the real file system cannot
#    show it to a test run as root). The page is rendered first, from a real ledger (pyfakefs does
#    not reach SQLite); `relay report --html` writes it with replace_file. --------------------------

@pytest.fixture
def rendered(project):
    relay = project.relay(agents=("Ann", "Ben"))
    project.drop("Ann", "a", "TO: Ben\nTHREAD: plan\n\nhello")
    relay.drain()
    return report.render(relay.history.figures(None), title="relay report: proj").encode()


@pytest.mark.parametrize("before", [None, b"<!doctype html><p>yesterday's page</p>"])
def test_a_disk_that_fills_while_the_page_is_written_leaves_what_was_at_the_name(rendered, fs, before):
    fs.create_dir("/out")
    if before is not None:
        fs.create_file("/out/report.html", contents=before)
    fill_disk(fs, len(rendered) // 2)
    with pytest.raises(OSError) as e:
        replace_file("/out/report.html", rendered)
    assert explain(e.value).startswith("the disk is full: No space left on device (")      # the verb's one line
    assert os.listdir("/out") == ([] if before is None else ["report.html"])
    if before is not None:
        assert open("/out/report.html", "rb").read() == before
    fs.set_disk_usage(1 << 40)
    replace_file("/out/report.html", rendered)
    assert open("/out/report.html", "rb").read() == rendered and os.listdir("/out") == ["report.html"]


def test_a_directory_made_read_only_while_the_page_is_written_leaves_the_old_page(rendered, fs):
    """Made read-only after the new page is written and synced beside the old one, before it
    is renamed over it: the rename is refused, and the old page is there whole."""
    fs.create_file("/out/report.html", contents=b"<!doctype html><p>yesterday's page</p>")
    synced = []

    def fsync(fd):
        if not synced:
            os.chmod("/out", 0o555)
            set_uid(4242)
        synced.append(fd)
    with pytest.raises(PermissionError) as e:
        replace_file("/out/report.html", rendered, fsync=fsync)
    assert explain(e.value).startswith("Permission denied")
    assert len(synced) == 1 and open("/out/report.html", "rb").read() == b"<!doctype html><p>yesterday's page</p>"


# -- relay report's default file ------------------------------------------------------------------

def test_report_writes_a_default_file_without_html(team):
    r = team("report")
    assert "wrote" in r.stdout
    path = r.stdout.split("wrote", 1)[1].strip()
    assert os.path.isfile(path) and "<html" in open(path).read().lower()


def test_relay_report_without_jinja2_says_how_to_install_it(project, monkeypatch, tmp_path):
    import sys
    project.relay(agents=("Ann",)).drain()
    import relay.operator
    monkeypatch.delitem(sys.modules, "relay.operator.templating", raising=False)
    monkeypatch.delattr(relay.operator, "templating", raising=False)
    monkeypatch.setitem(sys.modules, "jinja2", None)        # as if installed with --no-deps
    r = CliRunner().invoke(main, ["--root", str(project.root), "report", "--html", str(tmp_path / "r.html")])
    assert r.exit_code == 1 and "pip install 'jinja2>=3.1'" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("seconds, said", [(None, ""), (0, "0s"), (59.9, "59s"), (60, "1m00s"), (90, "1m30s"),
                                           (3599, "59m59s"), (3600, "1h00m"), (86399, "23h59m"), (86400, "1d00h"),
                                           (90000, "1d01h")])
def test_an_age_on_the_pages_is_said_in_its_largest_unit_from_one_of_it(seconds, said):
    from relay.operator.templating import age
    assert age(seconds) == said


@pytest.mark.parametrize("ts, said", [(None, ""), ("", ""), (0, "1970-01-01 00:00:00"),
                                      (1_700_000_000.9, "2023-11-14 22:13:20"), ("then", "(unreadable: 'then')"),
                                      (b"\x00", "(unreadable: b'\\x00')"),
                                      ("x" * 100, "(unreadable: '" + "x" * 59 + ")")])
def test_a_time_on_the_pages_is_utc_and_one_that_is_no_number_is_shown_marked_and_cut(ts, said):
    from relay.operator.templating import utc
    assert utc(ts) == said


def test_an_hours_bar_is_as_tall_as_its_count_is_of_the_busiest_hours():
    import re

    from relay.operator.templating import hour_bars
    svg = str(hour_bars([(500_000, 2), (500_002, 4)], top=4, height=120))
    bars = [(int(h), int(y), title) for y, h, title in re.findall(r'<rect x="\d+" y="(\d+)" width="\d+" height="(\d+)" '
                                                                     r'fill="#2b6cb0"><title>([^<]*)</title>', svg)]
    assert bars == [(55, 65, "2027-01-15 08:00: 2"), (0, 120, "2027-01-15 09:00: 0"), (110, 10, "2027-01-15 10:00: 4")]
    assert '<text x="0" y="12" font-size="11">4</text>' in svg
    assert "No messages in this period." in str(hour_bars([], top=0))


@pytest.mark.parametrize("tid, href", [("t-1", "/threads/t-1"), ("a/b c", "/threads/a%2Fb%20c"),
                                       (".", "/messages?thread=."), ("..", "/messages?thread=.."),
                                       ("", "/messages?thread="), ("...x", "/threads/...x"), (7, "/threads/7")])
def test_a_threads_address_quotes_every_character_and_a_dot_segment_goes_as_a_filter(tid, href):
    from relay.operator.templating import thread_href
    assert thread_href(tid) == href


def test_the_pages_filters_say_words_sheds_and_numbers_as_people_read_them():
    from markupsafe import Markup

    from relay.operator.templating import css_word, inert, number, sheds
    assert css_word("Per_Pair-Rate 2") == "perpairrate" and css_word("x" * 30) == "x" * 20
    assert sheds({"queue_limit": 2, "body_size": 0, "per_pair_rate": 1}) == "queue_limit 2, per_pair_rate 1"
    assert sheds({"queue_limit": 0}) == "-" and sheds(None) == "-"
    assert number(600.0) == 600 and isinstance(number(600.0), int) and number(2.5) == 2.5 and number("x") == "x"
    assert inert(None) == "" and inert(7) == 7 and inert("a\nb\tc") == "a\nb\tc"
    assert inert(Markup("<b>")) == Markup("<b>") and inert("\x1b[2J") != "\x1b[2J"


def test_the_report_of_a_project_with_no_message_yet_says_so_and_counts_nothing(project, tmp_path):
    project.relay(agents=("Ann", "Ben")).drain()
    out = tmp_path / "empty.html"
    r = CliRunner().invoke(main, ["--root", str(project.root), "report", "--html", str(out)])
    assert r.exit_code == 0, r.output
    html = out.read_text()
    assert "No messages in this period." in html and "<svg" not in html
