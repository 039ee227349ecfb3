"""python -m data.download against a local HTTP server: a small archive in UCI's nested layout is
checked, unpacked where data/uci_har.py reads it, refused when its checksum or content is wrong
(with nothing left behind), and resumed from its .part file when the connection breaks."""
import contextlib
import dataclasses
import hashlib
import io
import re
import socket
import sys
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from conftest import run_subprocess
from data import download, uci_har
from test_bad_input import assert_refused, snapshot, write_fake_uci
from training.entry_point import run_entry_point

FOLDER = uci_har.DATASET_FOLDER
OUTER_NAME = "human+activity+recognition+using+smartphones.zip"


def zip_bytes(files):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def tree_files(root, prefix):
    return {f"{prefix}/{path.relative_to(root).as_posix()}": path.read_bytes()
            for path in sorted(root.rglob("*")) if path.is_file()}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """The fake dataset and the two archives UCI's own is made of: the inner 'UCI HAR Dataset.zip'
    (with a Mac's __MACOSX copies beside the folder) and the outer zip that holds it."""
    root = write_fake_uci(tmp_path_factory.mktemp("source") / FOLDER)
    inner = zip_bytes({**tree_files(root, FOLDER), f"__MACOSX/{FOLDER}/._README.txt": b"\0\5\26\7"})
    outer = zip_bytes({f"{FOLDER}.zip": inner, f"{FOLDER}.names": b"the dataset's description"})
    return {"root": root, "inner": inner, "outer": outer}


@dataclasses.dataclass
class Route:
    body: bytes
    ranges: bool = True  # honours Range requests
    cuts: list = dataclasses.field(default_factory=list)  # the next responses break off after this many bytes
    length: bool = True  # sends Content-Length (else the body ends when the connection closes)


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        server = self.server
        route = server.routes.get(self.path)
        server.requests.append((self.path, self.headers.get("Range")))
        if route is None:
            self.send_error(404)
            return
        start, body = 0, route.body
        if self.headers.get("Range") and route.ranges:
            start = int(re.fullmatch(r"bytes=(\d+)-", self.headers["Range"]).group(1))
            if start >= len(body):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        if route.length:
            self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        payload = body[start:]
        if route.cuts:
            payload = payload[:route.cuts.pop(0)]
            self.close_connection = True
        try:
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):  # a client that stopped reading
            return
        server.bytes_served += len(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    monkeypatch.setattr(download, "RETRY_WAIT_S", 0.0)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.routes, httpd.requests, httpd.bytes_served = {}, [], 0

    def serve(path, body, **options):
        httpd.routes[path] = Route(body, **options)
        return f"http://127.0.0.1:{httpd.server_address[1]}{path}"

    httpd.serve = serve
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def run_download(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = run_entry_point(download.main, ["uci-har", *map(str, argv)])
        except SystemExit as exc:  # argparse
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def assert_loads_as(dest, source_root):
    root = uci_har.find_root(dest)
    assert root == dest / FOLDER
    for split in ("train", "test"):
        for got, want in zip(uci_har.load_split(root, split), uci_har.load_split(source_root, split), strict=True):
            np.testing.assert_array_equal(got, want)


def test_a_good_download_unpacks_where_the_loader_reads_it_and_is_not_fetched_again(server, source, tmp_path):
    url = server.serve(f"/240/{OUTER_NAME}", source["outer"])
    dest = tmp_path / "data"
    code, out, err = run_download("--dest", dest, "--url", url, "--sha256", sha256(source["outer"]))
    assert code == 0, err
    assert_loads_as(dest, source["root"])
    # The archive, its .part, the scratch folder and the __MACOSX copies are all gone.
    assert sorted(path.name for path in dest.iterdir()) == [FOLDER]
    assert f"train on it: python main.py --data-dir {dest}" in out
    assert "12 train windows of 3 subjects, 6 test windows of 2 subjects" in out
    assert server.bytes_served == len(source["outer"])

    before = snapshot(dest)
    code, out, err = run_download("--dest", dest, "--url", url)
    assert code == 0, err
    assert "nothing downloaded" in out
    assert len(server.requests) == 1
    assert snapshot(dest) == before


def test_a_recorded_checksum_needs_no_flag_and_the_inner_zip_alone_is_accepted(server, source, tmp_path, monkeypatch):
    # A mirror serving 'UCI HAR Dataset.zip' itself (as UCI's old address did), recorded in the table.
    recorded = download.KnownArchive(sha256(source["inner"]), len(source["inner"]), "the inner zip of the test")
    monkeypatch.setitem(download.DATASETS, "uci-har",
                        dataclasses.replace(download.DATASETS["uci-har"], known=(recorded,)))
    url = server.serve("/00240/UCI%20HAR%20Dataset.zip", source["inner"])
    code, out, err = run_download("--dest", tmp_path, "--url", url)
    assert code == 0, err
    assert "the inner zip of the test" in out
    assert_loads_as(tmp_path, source["root"])


@pytest.mark.parametrize("given", [None, "0" * 64])
def test_a_wrong_checksum_is_refused_in_one_line_leaving_nothing(server, source, tmp_path, given):
    url = server.serve(f"/{OUTER_NAME}", source["outer"])
    (tmp_path / "notes.txt").write_text("someone's own file")
    before = snapshot(tmp_path)
    flags = ["--sha256", given] if given else []
    line = assert_refused(run_download("--dest", tmp_path, "--url", url, *flags),
                          sha256(source["outer"]), "removed")
    assert ("--sha256 gives" in line) == bool(given)
    assert snapshot(tmp_path) == before  # nothing unpacked, no .part, no archive, no scratch folder


def test_the_command_line_refuses_a_wrong_checksum_without_a_traceback(server, source, tmp_path):
    url = server.serve(f"/{OUTER_NAME}", source["outer"])
    result = run_subprocess([sys.executable, "-m", "data.download", "uci-har", "--dest", tmp_path, "--url", url],
                            timeout=60, env={"no_proxy": "127.0.0.1"})
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ") and len(result.stderr.splitlines()) == 1, result.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_existing_dataset_folder_is_left_untouched(server, source, tmp_path):
    url = server.serve(f"/{OUTER_NAME}", source["outer"])
    write_fake_uci(tmp_path / FOLDER)
    before = snapshot(tmp_path)
    code, out, err = run_download("--dest", tmp_path, "--url", url)
    assert code == 0, err
    assert "already there: nothing downloaded" in out
    assert server.requests == []
    assert snapshot(tmp_path) == before


def test_an_incomplete_dataset_folder_is_refused_before_any_download(server, source, tmp_path):
    url = server.serve(f"/{OUTER_NAME}", source["outer"])
    (tmp_path / FOLDER).mkdir()
    (tmp_path / FOLDER / "README.txt").write_text("half of a hand-made copy")
    before = snapshot(tmp_path)
    assert_refused(run_download("--dest", tmp_path, "--url", url, "--sha256", sha256(source["outer"])),
                   str(tmp_path / FOLDER), "move it away")
    assert server.requests == []
    assert snapshot(tmp_path) == before


def test_an_interrupted_download_resumes_from_its_part_file(server, source, tmp_path):
    body = source["outer"]
    cut = len(body) // 3
    url = server.serve(f"/{OUTER_NAME}", body, cuts=[cut])
    flags = ["--dest", tmp_path, "--url", url, "--sha256", sha256(body)]
    assert_refused(run_download(*flags, "--retries", "0"), f"broke after {cut:,} bytes",
                   "run the same command again to resume")
    part = tmp_path / f"{OUTER_NAME}.part"
    assert part.read_bytes() == body[:cut]
    assert not (tmp_path / FOLDER).exists()

    code, out, err = run_download(*flags)
    assert code == 0, err
    assert server.requests[-1] == (f"/{OUTER_NAME}", f"bytes={cut}-")
    assert server.bytes_served == len(body)  # the first third was not sent twice
    assert_loads_as(tmp_path, source["root"])
    assert not part.exists()


def test_an_unreachable_or_missing_archive_is_refused_in_one_line(server, tmp_path):
    with socket.socket() as probe:  # a port nothing listens on once this closes
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    missing = server.serve("/elsewhere.zip", b"")
    for url, message in ((missing.replace("elsewhere", "missing"), "answered HTTP 404"),
                         (f"http://127.0.0.1:{closed_port}/{OUTER_NAME}", "cannot download")):
        assert_refused(run_download("--dest", tmp_path, "--url", url, "--retries", "0"), url, message)
        assert list(tmp_path.iterdir()) == []


def test_a_broken_connection_is_resumed_within_the_same_run(server, source, tmp_path):
    body = source["outer"]
    url = server.serve(f"/{OUTER_NAME}", body, cuts=[len(body) // 4, len(body) // 4])
    code, out, err = run_download("--dest", tmp_path, "--url", url, "--sha256", sha256(body), "--retries", "2")
    assert code == 0, err
    assert out.count("connection broke") == 2
    assert [header for _, header in server.requests] == [None, f"bytes={len(body) // 4}-",
                                                         f"bytes={2 * (len(body) // 4)}-"]
    assert server.bytes_served == len(body)
    assert_loads_as(tmp_path, source["root"])


def test_a_server_without_ranges_is_downloaded_again_from_the_start(server, source, tmp_path):
    body = source["outer"]
    url = server.serve(f"/{OUTER_NAME}", body, ranges=False, cuts=[100])
    code, out, err = run_download("--dest", tmp_path, "--url", url, "--sha256", sha256(body), "--retries", "1")
    assert code == 0, err
    assert "does not resume from byte 100" in out
    assert server.bytes_served == 100 + len(body)
    assert_loads_as(tmp_path, source["root"])


def test_a_complete_part_file_is_not_fetched_again(server, source, tmp_path):
    body = source["outer"]
    url = server.serve(f"/{OUTER_NAME}", body)
    (tmp_path / f"{OUTER_NAME}.part").write_bytes(body)
    code, out, err = run_download("--dest", tmp_path, "--url", url, "--sha256", sha256(body))
    assert code == 0, err
    assert server.requests == [(f"/{OUTER_NAME}", f"bytes={len(body)}-")]
    assert server.bytes_served == 0
    assert_loads_as(tmp_path, source["root"])


def test_an_archive_on_disk_is_unpacked_and_kept(source, tmp_path):
    archive = tmp_path / "by-hand.zip"
    archive.write_bytes(source["outer"])
    dest = tmp_path / "data"
    code, out, err = run_download("--dest", dest, "--archive", archive, "--sha256", sha256(source["outer"]))
    assert code == 0, err
    assert archive.read_bytes() == source["outer"]
    assert_loads_as(dest, source["root"])


def damaged_archives(source):
    root = source["root"]
    labels = f"{FOLDER}/train/y_train.txt"
    bad_labels = {**tree_files(root, FOLDER), labels: b"9\n" * 12}
    return {"not a zip": (source["outer"][:1000], "is not a readable zip"),
            "no dataset folder": (zip_bytes({"README.txt": b"hello"}), f"holds no '{FOLDER}/' folder"),
            "no inertial signals": (zip_bytes({f"{FOLDER}/README.txt": b"hello"}), "without train/Inertial Signals"),
            "labels out of range": (zip_bytes(bad_labels), "label 9 is outside 1..6")}


@pytest.mark.parametrize("case", ["not a zip", "no dataset folder", "no inertial signals", "labels out of range"])
def test_an_archive_with_the_right_checksum_but_no_dataset_is_refused_with_nothing_unpacked(source, tmp_path, case):
    body, message = damaged_archives(source)[case]
    archive = tmp_path / "mirror.zip"
    archive.write_bytes(body)
    dest = tmp_path / "data"
    line = assert_refused(run_download("--dest", dest, "--archive", archive, "--sha256", sha256(body)), message)
    assert "nothing was unpacked" in line
    assert list(dest.iterdir()) == []  # no dataset, no scratch folder
    assert archive.read_bytes() == body


def test_a_dest_that_cannot_be_created_is_refused(source, tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    archive = tmp_path / "by-hand.zip"
    archive.write_bytes(source["outer"])
    assert_refused(run_download("--dest", tmp_path / "a-file" / "data", "--archive", archive), "cannot be created")
