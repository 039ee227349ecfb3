"""Fetch a public dataset's archive, check its SHA-256, and unpack it where --data-dir finds it.

python -m data.download uci-har [--dest DIR] [--url URL] [--sha256 HEX] [--archive ZIP]

The download goes to DEST/<archive name>.part and resumes from there (HTTP Range) when the
connection breaks, within a run (--retries) or when the same command is run again. The finished
archive is accepted only when its SHA-256 is one recorded here for that dataset (docs/data.md
lists them), or the one --sha256 gives; a download that fails it is removed and refused. Only what
the command made is ever removed: a file already in DEST under the archive's name is checked as
--archive would be, and left there whatever the outcome. No download grows past the largest archive
that can pass the check, and no zip member is unpacked past the dataset's recorded sizes. It is
unpacked into a temporary folder beside the target, loaded with the project's own reader, and only
then renamed into place, so a failure never leaves a half-unpacked dataset and never touches one
already there.
"""
import argparse
import http.client
import re
import shutil
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections import namedtuple
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from data import uci_har
from data.errors import DataError, exit_from_command
from data.provenance import file_sha256
from outputs.safety import make_folder

DEFAULT_DEST = "~/data"  # the folder the docs give to --data-dir
CHUNK_BYTES = 1 << 20
TIMEOUT_S = 60
RETRY_WAIT_S = 2.0  # doubled after each broken attempt
USER_AGENT = "har-trainer-download/1"
KnownArchive = namedtuple("KnownArchive", "sha256 size_bytes what")  # an archive with a recorded SHA-256
# With --sha256 the archive is none recorded here: a repackaging of the same data, allowed this many
# times the largest recorded size.
UNRECORDED_ARCHIVE_FACTOR = 4


@dataclass(frozen=True)
class Dataset:
    folder: str  # the folder the archive holds and --data-dir finds under --dest
    url: str
    known: tuple  # of KnownArchive
    citation: str
    reader: ModuleType  # find_root(dir) and load_split(root, split), as training reads the dataset
    max_unpacked_bytes: int  # bounds what an archive may declare: its files together, and each one
    max_file_bytes: int

    def max_archive_bytes(self, sha256_given):
        """The most bytes an archive can have and still pass the checksum check."""
        largest = max(known.size_bytes for known in self.known)
        return largest * UNRECORDED_ARCHIVE_FACTOR if sha256_given else largest


# Checksums as published by several unrelated projects that pin these archives (docs/data.md says
# which were seen where); they have not been computed here, as this code was written offline.
DATASETS = {
    "uci-har": Dataset(
        folder=uci_har.DATASET_FOLDER,
        url="https://archive.ics.uci.edu/static/public/240/human+activity+recognition+using+smartphones.zip",
        known=(
            KnownArchive("c00b803081a5c797cd5e4b83700a9810b38d53d9d84e01917e090e1fdbc81031", 61_005_872,
                         "the official UCI archive (it holds 'UCI HAR Dataset.zip')"),
            KnownArchive("2045e435c955214b38145fb5fa00776c72814f01b203fec405152dac7d5bfeb0", 60_999_314,
                         "'UCI HAR Dataset.zip', the archive inside the official one"),
        ),
        citation="Anguita, Ghio, Oneto, Parra, Reyes-Ortiz, ESANN 2013; doi:10.24432/C54S4K; CC BY 4.0",
        reader=uci_har,
        # By its row counts about 280 MB unpacked, its largest file (train/X_train.txt) about 66 MB.
        max_unpacked_bytes=1_000_000_000, max_file_bytes=250_000_000),
}


def main(argv=None):
    options = parse(argv)
    dataset = DATASETS[options.name]
    dest = Path(options.dest).expanduser()
    if (root := dataset.reader.find_root(dest)) is not None:
        print(f"{root} is already there: nothing downloaded. Train on it: python main.py --data-dir {dest}")
        return 0
    target = dest / dataset.folder
    if target.exists():
        raise DataError(f"{target} exists but does not hold the dataset (no train/Inertial Signals or test/); "
                        "move it away or choose another --dest")
    make_folder(dest, "--dest")
    if options.archive:
        archive, made_here = Path(options.archive).expanduser(), False
        if not archive.is_file():
            raise DataError(f"--archive {archive}: no such file")
    else:
        limit = dataset.max_archive_bytes(options.sha256 is not None)
        archive, made_here = fetch(options.url or dataset.url, dest, options.retries, limit)
    consequence = ("it was removed (resuming from corrupt bytes cannot mend them): run again to download afresh"
                   if made_here else "it was left as it is and nothing was unpacked")
    try:
        print(f"{archive.name}: {describe_checksum(archive, dataset, options.sha256, consequence)}", flush=True)
    except DataError:
        if made_here:
            archive.unlink()
        raise
    summary = unpack(archive, dest, dataset)
    if made_here and not options.keep_archive:
        archive.unlink()
    print(f"{target}: {summary}")
    print(f"cite it: {dataset.citation}")
    print(f"train on it: python main.py --data-dir {dest}")
    return 0


def parse(argv):
    parser = argparse.ArgumentParser(prog="python -m data.download", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=tuple(DATASETS), help="the dataset")
    parser.add_argument("--dest", default=DEFAULT_DEST, metavar="DIR",
                        help="the folder to unpack into, the one you then give to --data-dir (default %(default)s)")
    parser.add_argument("--url", default=None, type=_web_address,
                        help="a mirror of the archive (default: the official one)")
    parser.add_argument("--sha256", default=None, type=_hex_digest, metavar="HEX",
                        help="the archive's SHA-256, required for an archive whose checksum is not recorded here")
    parser.add_argument("--archive", default=None, metavar="ZIP",
                        help="a zip already on disk (downloaded by hand): checked and unpacked, never removed")
    parser.add_argument("--retries", type=int, default=3, metavar="N",
                        help="times a broken connection is resumed before giving up (default %(default)s)")
    parser.add_argument("--keep-archive", action="store_true", help="keep the downloaded zip in --dest")
    options = parser.parse_args(argv)
    if options.retries < 0:
        parser.error("--retries must not be negative")
    if options.archive and options.url:
        parser.error("--archive unpacks a file already on disk; drop --url")
    return options


def _web_address(text):
    try:
        parts = urllib.parse.urlsplit(text)
    except ValueError:  # an unclosed [IPv6 address
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http:// or https:// address")
    return text


def _hex_digest(text):
    if not re.fullmatch(r"[0-9a-fA-F]{64}", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a SHA-256 (64 hexadecimal digits)")
    return text.lower()


def fetch(url, dest, retries, limit_bytes):
    """Download `url` into dest, resuming from a .part file, refusing more than `limit_bytes`; return
    (the finished file's path, whether this command made it)."""
    name = Path(urllib.parse.unquote(urllib.parse.urlsplit(url).path)).name or "archive.zip"
    finished, part = dest / name, dest / f"{name}.part"
    if finished.exists():
        # Whoever put it there (a hand download, a kept archive, a file of the same name), it is not
        # this command's: checked, never removed.
        if not finished.is_file():
            raise DataError(f"{finished} is in the way of the download; move it away or choose another --dest")
        print(f"{finished} is already there: checking it instead of downloading (it is left in place)", flush=True)
        return finished, False
    attempt = 0
    while True:
        try:
            _fetch_once(url, part, limit_bytes)
            part.replace(finished)
            return finished, True
        except urllib.error.HTTPError as exc:
            raise DataError(f"{url} answered HTTP {exc.code} {exc.reason}; check the address or pass "
                            "--url a mirror") from None
        except (http.client.HTTPException, urllib.error.URLError, OSError) as exc:
            have = part.stat().st_size if part.exists() else 0
            reason = str(getattr(exc, "reason", None) or exc) or exc.__class__.__name__
            if attempt == retries and not have:
                raise DataError(f"cannot download {url} ({reason}); check the connection, or pass --url a mirror "
                                "or --archive a zip downloaded by hand") from None
            if attempt == retries:
                raise DataError(f"download of {url} broke after {have:,} bytes ({reason}); they are kept in "
                                f"{part}: run the same command again to resume") from None
            wait_s = RETRY_WAIT_S * 2 ** attempt
            attempt += 1
            what = f"connection broke after {have:,} bytes" if have else "download failed"
            print(f"{what} ({reason}); trying again in {wait_s:g} s (retry {attempt} of {retries})", flush=True)
            time.sleep(wait_s)


def _fetch_once(url, part, limit_bytes):
    """One request for the bytes `part` lacks, appended to it; raises on a short or broken transfer,
    and DataError on a file larger than `limit_bytes` (before writing when the server says its size)."""
    offset = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": USER_AGENT, **({"Range": f"bytes={offset}-"} if offset else {})}
    try:
        response = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and offset:  # nothing after `offset`: complete, or a different file
            if _content_range(exc.headers.get("Content-Range")) == (None, offset):
                return
            part.unlink()
            raise ConnectionError(f"{part.name} does not match the file the server has; starting afresh") from None
        raise
    with response:
        start, total = _content_range(response.headers.get("Content-Range"))
        if response.status == 206 and start != offset:
            part.unlink()
            raise ConnectionError(f"asked for byte {offset:,} on, the server sent from byte {start}; starting afresh")
        if response.status != 206:
            if offset:
                print(f"the server does not resume from byte {offset:,}: downloading from the start", flush=True)
            offset, length = 0, response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
        if total is not None and total > limit_bytes:
            raise DataError(f"{url} is {total:,} bytes, more than the archive can be ({limit_bytes:,}); nothing "
                            "more was downloaded: check --url")
        size = f" ({total / 1e6:.1f} MB)" if total else ""
        resumed = f", resuming at {offset / 1e6:.1f} MB" if offset else ""
        print(f"downloading {url}{size}{resumed}", flush=True)
        with open(part, "ab" if offset else "wb") as handle:
            _copy(response, handle, offset, total, limit_bytes)
    if part.stat().st_size > limit_bytes:
        part.unlink()
        raise DataError(f"{url} sent more than {limit_bytes:,} bytes, more than the archive can be; the download "
                        "was stopped and removed: check --url")
    have = part.stat().st_size
    if total is not None and have != total:
        raise ConnectionError(f"the server sent {have:,} of {total:,} bytes")


def _copy(response, handle, have, total, limit_bytes):
    """Stream the body into the file, with a progress line every tenth (or every 10 MB), stopping one
    chunk past `limit_bytes`."""
    step = total // 10 if total else 10_000_000
    next_report = (have // step + 1) * step
    while have <= limit_bytes and (chunk := response.read(CHUNK_BYTES)):
        handle.write(chunk)
        have += len(chunk)
        if have >= next_report:
            print(f"  {have / 1e6:.1f} MB" + (f" of {total / 1e6:.1f} MB" if total else ""), flush=True)
            next_report = (have // step + 1) * step


def _content_range(header):
    """(first byte, total) from `bytes 100-199/200` or `bytes */200`; (None, None) when absent."""
    match = re.fullmatch(r"bytes (?:(\d+)-\d+|\*)/(\d+|\*)", (header or "").strip())
    if not match:
        return None, None
    first, total = match.groups()
    return (int(first) if first else None), (int(total) if total != "*" else None)


def describe_checksum(archive, dataset, expected, consequence):
    """What the archive is, by its SHA-256; DataError (ending with `consequence`) when it is neither
    the one --sha256 gives nor, without --sha256, one recorded for the dataset."""
    actual = file_sha256(archive)
    if expected:
        if actual == expected:
            return f"SHA-256 {actual}, as --sha256 gives"
        raise DataError(f"{archive} has SHA-256 {actual}, not {expected} as --sha256 gives; {consequence}")
    for known in dataset.known:
        if actual == known.sha256:
            return f"SHA-256 {actual}: {known.what}"
    recorded = " or ".join(f"{known.sha256[:12]}... ({known.size_bytes:,} bytes)" for known in dataset.known)
    raise DataError(f"{archive} ({archive.stat().st_size:,} bytes) has SHA-256 {actual}, which is no recorded "
                    f"archive of this dataset ({recorded}): a corrupt download, or a mirror or release with no "
                    f"recorded checksum; {consequence}; pass --sha256 {actual} only if you trust its source")


def unpack(archive, dest, dataset):
    """Unpack the dataset's folder from the archive (or from the zip of that name inside it) into a
    temporary folder in dest, load it with the project's reader, then rename it into place."""
    folder = dataset.folder
    scratch = Path(tempfile.mkdtemp(prefix=f".{folder}.unpacking-", dir=dest))
    try:
        source = _open_zip(archive)
        with source:
            nested = f"{folder}.zip"
            if nested in source.namelist() and not _members_under(source, folder):
                _check_sizes([source.getinfo(nested)], dataset, archive)
                source.extract(nested, scratch)
                with _open_zip(scratch / nested) as inner:
                    _extract_folder(inner, dataset, scratch, archive)
            else:
                _extract_folder(source, dataset, scratch, archive)
        summary = _check_layout(dataset.reader, scratch / folder, archive)
        if (dest / folder).exists():  # another run finished first: keep its copy
            raise DataError(f"{dest / folder} appeared while unpacking; nothing was replaced")
        (scratch / folder).rename(dest / folder)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return summary


def _open_zip(path):
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise DataError(f"{path} is not a readable zip ({exc}); nothing was unpacked") from None


def _members_under(source, folder):
    return [info for info in source.infolist() if info.filename.startswith(f"{folder}/")]


def _check_sizes(members, dataset, archive):
    """Refuse, before writing a byte, members that declare more than the dataset can hold (zipfile
    never writes more than a member declares)."""
    big = next((info for info in members if info.file_size > dataset.max_file_bytes), None)
    if big is not None:
        raise DataError(f"{archive}: {big.filename} declares {big.file_size:,} bytes, more than any file of the "
                        f"dataset ({dataset.max_file_bytes:,}); nothing was unpacked")
    total = sum(info.file_size for info in members)
    if total > dataset.max_unpacked_bytes:
        raise DataError(f"{archive} declares {total:,} bytes unpacked, more than the dataset "
                        f"({dataset.max_unpacked_bytes:,}); nothing was unpacked")


def _extract_folder(source, dataset, scratch, archive):
    """Extract only the dataset's folder (a Mac's __MACOSX/ copies stay behind); ZipFile.extract keeps
    every name inside scratch, whatever `..` or absolute path a member claims."""
    folder = dataset.folder
    members = _members_under(source, folder)
    if not members:
        raise DataError(f"{archive} holds no '{folder}/' folder (nor a '{folder}.zip'); nothing was unpacked")
    _check_sizes(members, dataset, archive)
    try:
        for info in members:
            source.extract(info, scratch)
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise DataError(f"{archive} cannot be unpacked ({exc}); nothing was unpacked") from None


def _check_layout(reader, root, archive):
    """Read both splits as training will (which also fills the loader's cache); a summary line."""
    if reader.find_root(root) != root:
        raise DataError(f"{archive} holds '{root.name}/' without train/Inertial Signals and test/; "
                        "nothing was unpacked")
    counts = []
    for split in ("train", "test"):
        try:
            _, labels, subjects = reader.load_split(root, split)
        except DataError as exc:
            raise DataError(f"{archive}: {exc}; nothing was unpacked") from None
        counts.append(f"{len(labels):,} {split} windows of {len(set(subjects.tolist()))} subjects")
    return ", ".join(counts)


if __name__ == "__main__":
    exit_from_command(main, "interrupted: the bytes downloaded so far are kept; run the same command again to resume")
