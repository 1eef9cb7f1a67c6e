"""WebDataset shards (img2dataset's layout) read as a stream with the standard library.

A shard is a tar file; consecutive members sharing a key (the path up to the first dot of the file name)
form a sample: `000001.jpg` (or png, webp, ...), `000001.txt` (the caption), `000001.json` (img2dataset's
metadata: key, url, caption, width, height, ...). img2dataset writes `NNNNN_stats.json` beside each shard,
whose `successes` count the shard's samples; when every shard has one, the number of samples is known
without reading a shard.

`vltool import` reads shards into a dataset through this module; `vltool pretrain` streams them
(vltool.pretrain.data.ShardStream) without importing. Every other command reads them through their index
(vltool.io.shard_index), built from the headers and small members (index_samples: the images are located,
not read) and whose images, `tar://MEMBER::SHARD`, are read by offset (read_member).
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import os
import re
import tarfile
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from vltool.errors import UsageError

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm", "pgm", "pnm")
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")


def expand_braces(pattern: str) -> list[str]:
    """`a{00..02}b{x,y}` -> a00bx a00by a01bx ... (braceexpand's rules for ranges and alternatives)."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    head, body, tail = pattern[: m.start()], m.group(1), pattern[m.end() :]
    r = re.fullmatch(r"(-?\d+)\.\.(-?\d+)", body)
    if r:
        a, b = r.groups()
        width = max(len(a), len(b)) if (a.lstrip("-").startswith("0") and len(a) > 1) or (b.startswith("0") and len(b) > 1) else 0
        lo, hi = int(a), int(b)
        step = 1 if hi >= lo else -1
        values = [str(v).zfill(width) for v in range(lo, hi + step, step)]
    elif "," in body:
        values = body.split(",")
    else:  # literal braces
        return [head + "{" + body + "}" + rest for rest in expand_braces(tail)]
    return [head + v + rest for v in values for rest in expand_braces(tail)]




def split_member(name: str) -> tuple[str, str] | None:
    """WebDataset's rule: the key is the path up to the first dot of the file name, the rest is the extension."""
    d, _, base = name.rpartition("/")
    if base.startswith((".", "_")) or "." not in base:
        return None
    stem, _, ext = base.partition(".")
    return (f"{d}/{stem}" if d else stem), ext.lower()


_ZERO_BLOCK = bytes(512)


def _tar_number(field: bytes) -> int:
    if field[:1] and field[0] & 0x80:  # GNU base-256 for large values
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _checksum_ok(header: bytes) -> bool:
    """The header's stored checksum equals its sum (unsigned, or signed as some old tars wrote it)."""
    stored = _tar_number(header[148:156])
    unsigned = sum(header[:148]) + 256 + sum(header[156:])
    return stored == unsigned or stored == unsigned - 256 * sum(1 for b in header[:148] + header[156:] if b > 127)


def _header_name(header: bytes) -> str:
    """A ustar header's own name (with its prefix)."""
    name = header[:100].split(b"\0", 1)[0]
    if header[257:262] == b"ustar":
        prefix = header[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "replace")


def _pax_path(data: bytes) -> str | None:
    """The `path` record of a PAX header ("LEN key=value\\n" records), or None."""
    path, i = None, 0
    while i < len(data):
        sp = data.index(b" ", i)
        n = int(data[i:sp])
        key, _, value = data[sp + 1 : i + n - 1].partition(b"=")
        if key == b"path":
            path = value.decode("utf-8", "replace")
        i += n
    return path


def _header(header: bytes) -> tuple[int, bytes] | None:
    """(data size, type flag) of a 512-byte tar header block; None at the archive's end (a zero block, or
    the end of the file). Raises tarfile.ReadError on a cut header or a bad checksum."""
    if len(header) < 512:
        if header.strip(b"\0"):
            raise tarfile.ReadError("truncated header")
        return None
    if header == _ZERO_BLOCK:
        return None
    if not _checksum_ok(header):
        raise tarfile.ReadError("bad header checksum")
    return _tar_number(header[124:136]), header[156:157]


def iter_tar(path) -> Iterator[tuple[str, bytes]]:
    """(name, data) of each regular file of a tar stream, in order (ustar, GNU long names, PAX paths).

    A few times faster than `tarfile` on shards of many small members. Raises `tarfile.ReadError` on
    a bad header checksum or a truncated archive; `.tar.gz` / `.tgz` are read through gzip.
    """
    path = str(path)
    raw = open(path, "rb", buffering=1 << 20)
    f = gzip.open(raw) if path.lower().endswith((".gz", ".tgz")) else raw
    try:
        long_name = None
        while True:
            header = f.read(512)
            parsed = _header(header)
            if parsed is None:
                return
            size, kind = parsed
            data = f.read(size)
            if len(data) < size:
                raise tarfile.ReadError("truncated member")
            if size % 512 and len(f.read(512 - size % 512)) < 512 - size % 512:
                raise tarfile.ReadError("truncated member")
            if kind == b"L":  # GNU long name of the next member
                long_name = data.split(b"\0", 1)[0].decode("utf-8", "replace")
                continue
            if kind == b"x":  # PAX header
                long_name = _pax_path(data) or long_name
                continue
            if kind not in (b"0", b"\0", b"7"):  # directories, links, global headers: no sample data
                long_name = None
                continue
            if long_name is not None:
                name, long_name = long_name, None
            else:
                name = _header_name(header)
            yield name, data
    finally:
        f.close()
        raw.close()


def iter_samples(path: str) -> Iterator[tuple[str, dict]]:
    """(key, {extension: bytes}) of each sample of a shard, in order. Raises tarfile.ReadError (and
    OSError) on a broken shard, after the samples before the damage."""
    yield from _grouped(iter_tar(path))


def _grouped(members, load=None) -> Iterator[tuple[str, dict]]:
    """WebDataset's samples from (member name, value) pairs in archive order: consecutive members sharing a
    key form one sample, {extension: value} (or load(extension, value)). A sample is yielded once the next
    key starts, so one cut short by an error in `members` is never yielded."""
    key, files = None, {}
    for name, value in members:
        parts = split_member(name)
        if parts is None:
            continue
        k, ext = parts
        if k != key:
            if key is not None:
                yield key, files
            key, files = k, {}
        files[ext] = load(ext, value) if load is not None else value
    if key is not None:
        yield key, files


def sample_image(files: dict) -> bytes | None:
    """The sample's image bytes: the first of IMAGE_EXTS it has."""
    return next((files[e] for e in IMAGE_EXTS if e in files), None)


def sample_meta(files: dict) -> dict:
    try:
        meta = json.loads(files["json"].decode("utf-8")) if "json" in files else {}
    except (UnicodeDecodeError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def sample_text(files: dict, column: str = "caption"):
    """The sample's text for `column`: `caption` is the `txt` member (else the json's caption); `captions`
    the json's list (vltool export writes it; else [the caption]); another name is the member with that
    extension or the json's key of that name."""
    if column == "caption":
        if "txt" in files:
            return files["txt"].decode("utf-8", errors="replace")
        return sample_meta(files).get("caption")
    if column == "captions":
        value = sample_meta(files).get("captions")
        if isinstance(value, list):
            return value
        cap = sample_text(files, "caption")
        return [cap] if isinstance(cap, str) else []
    if column in files:
        return files[column].decode("utf-8", errors="replace")
    return sample_meta(files).get(column)


def sample_id(key: str, files: dict) -> str:
    """img2dataset's `key` in the json (else the tar key)."""
    meta = sample_meta(files)
    for name in ("id", "key"):
        if isinstance(meta.get(name), str) and meta[name]:
            return meta[name]
    return key


def is_shard_spec(spec: str) -> bool:
    """True when `spec` names tar shards: a pattern or path ending in .tar (.tar.gz, .tgz)."""
    return os.path.expanduser(str(spec)).lower().endswith(TAR_SUFFIXES)


def expand_shards(spec: str) -> list[Path]:
    """The shards `spec` names: braces expanded (`shards/{00000..00999}.tar`), then globs; a directory
    means every tar file in it, sorted. Each must exist."""
    text = os.path.expanduser(str(spec))
    if Path(text).is_dir():
        found = sorted(p for p in Path(text).iterdir() if p.name.lower().endswith(TAR_SUFFIXES))
        if not found:
            raise UsageError(f"{spec!r} holds no tar shards (*.tar, *.tar.gz, *.tgz)")
        return found
    paths: list[Path] = []
    for pat in expand_braces(text):
        if any(ch in pat for ch in "*?["):
            found = sorted(glob.glob(pat))
            if not found:
                raise UsageError(f"shards {spec!r}: the pattern {pat!r} matches no file")
            paths.extend(Path(p) for p in found)
        elif not Path(pat).is_file():
            raise UsageError(f"shards {spec!r}: {pat} does not exist")
        else:
            paths.append(Path(pat))
    if not paths:
        raise UsageError(f"shards {spec!r} name no file")
    return list(dict.fromkeys(paths))


def stats_file(shard: Path) -> Path:
    """img2dataset's statistics of a shard: 00000.tar -> 00000_stats.json."""
    name = shard.name
    for suffix in TAR_SUFFIXES:
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
            break
    return shard.with_name(f"{name}_stats.json")


def shard_samples(shard: Path) -> int | None:
    """The shard's samples from img2dataset's statistics file, or None."""
    try:
        n = json.loads(stats_file(shard).read_text()).get("successes")
    except (OSError, ValueError, AttributeError):
        return None
    return n if isinstance(n, int) and n >= 0 else None


@dataclass
class ShardSource:
    """Training shards named by one DATA argument, and what provenance needs to know about them."""

    spec: str
    shards: list[Path] = field(repr=False)
    rows: int | None  # from img2dataset's statistics files when every shard has one
    fingerprint: str  # SHA-256 of each shard's path, size and modification time (no shard is read)

    @property
    def path(self) -> Path:
        """The directory holding the shards (an output may not be inside it)."""
        return Path(os.path.commonpath([str(p.resolve().parent) for p in self.shards]))

    @property
    def reads(self) -> list[Path]:
        """Every path these shards' readers read (as LoadedDataset.reads): their folder."""
        return [self.path]

    def provenance(self) -> dict:
        return {"spec": self.spec, "path": str(self.path), "format": "wds", "shards": len(self.shards),
                "fingerprint": self.fingerprint, "rows": self.rows}


def load_shards(spec: str) -> ShardSource:
    shards = expand_shards(spec)
    h = hashlib.sha256()
    for p in shards:
        st = p.stat()
        h.update(f"{p.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    counts = [shard_samples(p) for p in shards]
    rows = None if any(c is None for c in counts) else sum(counts)
    return ShardSource(str(spec), shards, rows, h.hexdigest()[:32])


# --------------------------------------------------------------------------------------------------
# Shards read by offset: the shard index (vltool.io.shard_index) and images decoded from it
#
# The index of a shard is built from its headers: a scan reads each 512-byte header, reads the small
# members (txt, json) and seeks past the others (the images), so indexing costs the headers and captions,
# not the images. An image is then named by fsspec's chained URL `tar://MEMBER::/abs/SHARD` and read with
# one pread at its offset (read_member), from a per-process table of the shard's members.

# Why a sample is skipped (`vltool import` and the shard index count them alike).
NO_IMAGE = "no image"
EMPTY_CAPTION = "empty caption"
DUPLICATE_ID = "duplicate id"
BAD_SHARD = "unreadable shard"

TAR_URL_SCHEME = "tar://"
SMALL_EXTS = ("txt", "json")  # the members the index reads; the others are only located


def text_value(v) -> str | None:
    """A caption cell as text: bytes decoded as UTF-8 (undecodable bytes are no caption), anything else as its string."""
    if v is None:
        return None
    if isinstance(v, (bytes, bytearray, memoryview)):
        try:
            return bytes(v).decode("utf-8")
        except UnicodeDecodeError:
            return None
    return v if isinstance(v, str) else str(v)


def clean_captions(value) -> list[str]:
    """The non-blank captions of a value (one text, or a list of texts), stripped."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [s for s in ((text_value(v) or "").strip() for v in value) if s]
    s = (text_value(value) or "").strip()
    return [s] if s else []


def tar_url(member: str, shard) -> str:
    """fsspec's chained URL of a tar member, `tar://MEMBER::/abs/SHARD` (datasets' Image decodes it too)."""
    return f"{TAR_URL_SCHEME}{member}::{os.path.abspath(str(shard))}"


def parse_tar_url(url: str) -> tuple[str, str] | None:
    """(member, shard) of a `tar://MEMBER::SHARD` URL, or None when `url` is not one."""
    if not isinstance(url, str) or not url.startswith(TAR_URL_SCHEME):
        return None
    member, sep, shard = url[len(TAR_URL_SCHEME) :].partition("::")
    return (member, shard) if sep and member and shard else None


def is_compressed(shard) -> bool:
    return str(shard).lower().endswith((".gz", ".tgz"))


@dataclass
class Member:
    """A regular file of a tar shard, located by its header."""

    name: str
    offset: int  # of its data in the shard
    size: int


class _Window:
    """Reads byte ranges of an open file by pread, keeping the last one: a header is one read of 512 bytes,
    a small member is read with the header after it (`ahead`), and nothing past them is read, so an image
    between two headers is seeked past, never read."""

    def __init__(self, fd: int):
        self.fd, self.start, self.buf, self.bytes_read = fd, 0, b"", 0

    def read(self, offset: int, n: int, ahead: int = 0) -> bytes:
        if not (self.start <= offset and offset + n <= self.start + len(self.buf)):
            self.buf, self.start = os.pread(self.fd, n + ahead, offset), offset
            self.bytes_read += len(self.buf)
        return self.buf[offset - self.start : offset - self.start + n]


def scan_members(window: _Window, file_size: int) -> Iterator[Member]:
    """Each regular file of an uncompressed tar, from its headers alone (ustar, GNU long names, PAX paths),
    in order. Raises tarfile.ReadError (a bad header, a member cut short) after the members before the damage."""
    pos, long_name = 0, None
    while True:
        header = window.read(pos, 512)
        parsed = _header(header)
        if parsed is None:
            return
        size, kind = parsed
        at = pos + 512
        pos = at + -(-size // 512) * 512  # the next header: past the data and its padding
        if pos > file_size:
            raise tarfile.ReadError("truncated member")
        if kind == b"L":
            long_name = window.read(at, size, pos - at - size + 512).split(b"\0", 1)[0].decode("utf-8", "replace")
            continue
        if kind == b"x":
            long_name = _pax_path(window.read(at, size, pos - at - size + 512)) or long_name
            continue
        if kind not in (b"0", b"\0", b"7"):
            long_name = None
            continue
        name = long_name if long_name is not None else _header_name(header)
        long_name = None
        yield Member(name, at, size)


def index_samples(path, stats: dict | None = None) -> Iterator[tuple[str, dict]]:
    """(key, files) of each sample of an uncompressed shard, grouped as iter_samples groups them, read
    from the headers: `files` maps txt and json to their bytes and every other extension (the image) to
    its Member, never read. `stats["bytes_read"]` counts the bytes read. Raises tarfile.ReadError (and
    OSError) after the samples before the damage; the sample the damage cuts is left out."""
    with open(path, "rb", buffering=0) as f:
        window = _Window(f.fileno())

        def load(ext, m):  # a small member comes with its padding and the next header (B: bytes)
            return window.read(m.offset, m.size, -(-m.size // 512) * 512 - m.size + 512) if ext in SMALL_EXTS else m

        try:
            yield from _grouped(((m.name, m) for m in scan_members(window, os.fstat(f.fileno()).st_size)), load)
        finally:
            if stats is not None:
                stats["bytes_read"] = stats.get("bytes_read", 0) + window.bytes_read


MEMBER_TABLES = "shards/members"  # under the vltool cache: <sha of a shard's path, size, time>.npz
MEMBER_TABLE_VERSION = 1


def member_table_path(path: str, stamp: tuple) -> Path:
    """Where the member table of the shard `path` (as it is now: `stamp`) is kept: in the vltool cache
    (`$VLTOOL_CACHE`, else ~/.cache/vltool, as vltool.io.default_cache_dir), whatever --cache-dir a command
    was given, so that every process that reads the shard finds it."""
    env = os.environ.get("VLTOOL_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "vltool"
    key = hashlib.sha256(f"v{MEMBER_TABLE_VERSION}:{os.path.abspath(path)}\0{stamp[0]}\0{stamp[1]}".encode()).hexdigest()[:32]
    return root / MEMBER_TABLES / f"{key}.npz"


class _OpenShard:
    """An open shard and its member table: the names (sorted), offsets and sizes of its members but the
    small ones (txt, json), i.e. its images. Read from the table file the first scan of the shard wrote
    in the vltool cache (shared by every process and command), else built by one scan of its headers (a
    damaged shard: the members before the damage) and written there for the next."""

    def __init__(self, path: str, stamp: tuple, size: int):
        self.stamp = stamp
        self.file = open(path, "rb", buffering=0)  # closed when the last reader drops it
        table = member_table_path(path, stamp)
        try:
            with np.load(table, allow_pickle=False) as z:
                self.names, self.offsets, self.sizes = z["names"], z["offsets"], z["sizes"]  # (M,) S, int64, int64
            READS["loads"] += 1
            return
        except (OSError, ValueError, KeyError):
            pass
        found = []
        try:
            for m in scan_members(_Window(self.file.fileno()), size):
                parts = split_member(m.name)
                if parts is None or parts[1] not in SMALL_EXTS:
                    found.append((m.name.encode("utf-8"), m.offset, m.size))
        except (tarfile.TarError, OSError, ValueError):
            pass
        READS["scans"] += 1
        found.sort(key=lambda t: t[0])  # (stable: a repeated name keeps its order)
        self.names = np.array([f[0] for f in found], dtype=bytes) if found else np.zeros(0, "S1")
        self.offsets = np.array([f[1] for f in found], dtype=np.int64)
        self.sizes = np.array([f[2] for f in found], dtype=np.int64)
        try:
            table.parent.mkdir(parents=True, exist_ok=True)
            tmp = table.with_name(f".{table.stem}.tmp-{os.getpid()}-{threading.get_ident()}.npz")
            np.savez(tmp, names=self.names, offsets=self.offsets, sizes=self.sizes)
            os.replace(tmp, table)
        except OSError:  # a cache that cannot be written: the next process scans again
            pass

    def find(self, member: str) -> tuple[int, int]:
        """(offset, size) of `member`; KeyError when the shard has no such member (or it is a txt/json)."""
        name = member.encode("utf-8")
        i = int(np.searchsorted(self.names, name, side="right")) - 1  # (a name written twice: the last, as tar does)
        if i < 0 or self.names[i] != name:
            raise KeyError(member)
        return int(self.offsets[i]), int(self.sizes[i])


OPEN_SHARDS = 32  # shards each process keeps open with their member tables (least recently used go first)
READS = {"scans": 0, "loads": 0, "reads": 0}  # this process's header scans, member tables read, member reads
_OPEN: "OrderedDict[str, _OpenShard]" = OrderedDict()
_OPEN_LOCK = threading.Lock()


def _forget_open_shards() -> None:
    """A forked child starts with its own table and lock (the parent's lock may be held by another thread)."""
    global _OPEN_LOCK
    _OPEN.clear()
    _OPEN_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_open_shards)


def read_member(url: str) -> bytes:
    """The bytes of the (image) member a `tar://MEMBER::SHARD` URL names: one pread at its offset, from the
    shard's member table (_OpenShard: one scan of its headers, kept in the vltool cache; the OPEN_SHARDS
    shards used last stay open in each process; a new table when the shard's size, time or inode change).
    Thread-safe. Raises KeyError (no such member; txt and json members are not in the table), OSError (no
    such shard, cut short) or ValueError (not a tar URL)."""
    parsed = parse_tar_url(url)
    if parsed is None:
        raise ValueError(f"not a tar:// URL: {url!r}")
    member, shard = parsed
    st = os.stat(shard)
    stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
    with _OPEN_LOCK:
        entry = _OPEN.get(shard)
        if entry is None or entry.stamp != stamp:
            entry = _OPEN[shard] = _OpenShard(shard, stamp, st.st_size)
            while len(_OPEN) > OPEN_SHARDS:
                _OPEN.popitem(last=False)
        _OPEN.move_to_end(shard)
        READS["reads"] += 1
    offset, size = entry.find(member)
    data = os.pread(entry.file.fileno(), size, offset)
    if len(data) != size:
        raise OSError(f"{shard}: member {member} is cut short")
    return data
