"""The on-disk cache: hash-named entries, built in staging, published by one rename.

Layout under the root (``AITER_MLA_CACHE_DIR``, default ``~/.cache/aiter_mla``)::

    entries/<key>/       meta.json (manifest, artifact size + sha256, arch, readable name,
                         toolchain-free lookup id: found without a compiler, core.py),
                         lib.so or code.hsaco, source.cu, build.log     -- never rewritten
    index/<lookup id>    the key that a lookup id resolved to (warm-hit shortcut, key.py)
    locks/<key>.lock     one flock per key (kept: deleting a lock file lets two builders in)
    locks/<key>.owner    who holds the lock, for waiters' messages only (never for liveness)
    staging/<key>.<pid>.<rand>/   a build in progress; same filesystem, so publish is a rename
    trash/               entries moved aside (corrupt, rebuilt, cleared) before deletion
    failed/<key>/        source.cu + build.log of the last failed build of a key (an
                         interrupted build's only where the key has no failure kept)
    used/<key>           last-use stamps (mtime) for LRU gc
    toolchains/          remembered ``--version`` outputs (toolchain.py)
    third_party/         pinned checkouts (third_party.py)

Sources of the rules: Triton's temp-folder-then-rename publish (#4295), CuPy's hash check on
read, FlashInfer's double-checked lock, torch's stale-lock hang (#189245) avoided with flock.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import stat
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from .. import env
from ..paths import unmakeable_folder_reason

log = logging.getLogger("aiter_mla.jit")

META = "meta.json"
_SUBDIRS = ("entries", "index", "locks", "staging", "trash", "failed", "used", "toolchains")


class CacheError(RuntimeError):
    """The cache cannot be used as asked."""


class CacheNotWritableError(CacheError):
    """A build is needed but the cache root cannot be written."""


class LockTimeoutError(CacheError, TimeoutError):
    """Another process held a key's lock for longer than ``AITER_MLA_LOCK_TIMEOUT``."""


@dataclass(frozen=True)
class Entry:
    """A verified, published entry."""

    key: str
    path: Path
    artifact: Path
    meta: dict

    @property
    def loadable(self) -> bool:
        return bool(self.meta.get("loadable"))


@dataclass(frozen=True)
class Corrupt:
    """An entry that exists but failed verification (``reason`` says how)."""

    key: str
    path: Path
    reason: str


def default_root() -> Path:
    """``$XDG_CACHE_HOME/aiter_mla`` if that is set to an absolute path (the XDG spec says a
    relative one is to be ignored: it would put the cache under whatever folder the process
    starts in), else ``~/.cache/aiter_mla``: HOME when absolute, else the account's home folder
    (a relative HOME would move the cache with the current folder too), else, where neither
    is known (a container's uid with no account and no usable HOME), :func:`fallback_root`."""
    xdg = env.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "aiter_mla"
    home = env.get("HOME")
    if not (home and os.path.isabs(home)):
        home = _account_home()
    return Path(home) / ".cache" / "aiter_mla" if home else fallback_root()


def _account_home() -> str | None:
    """The user's home folder from the password database, or None where the uid has no
    account (HOME is unset, blank or relative here, and os.path.expanduser("~") would read
    that HOME back: a cache under "  /.cache" or under the current folder)."""
    try:
        import pwd
        home = pwd.getpwuid(os.getuid()).pw_dir
    except (ImportError, KeyError):
        return None
    return home if os.path.isabs(home) else None


def _read_only_mount(folder: Path) -> bool:
    """Whether ``folder`` is on a file system mounted read-only (its errno is then EROFS, not
    the EACCES a permission gives)."""
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def fallback_root() -> Path:
    """Where builds go when the default root is read-only (per user, under the temp dir)."""
    return Path(tempfile.gettempdir()) / f"aiter_mla-{os.getuid()}"


def _private_dir_problems(root: Path) -> list[str]:
    """Why ``root`` (which exists) is not a folder only this user can write, if it is not."""
    st = os.lstat(root)
    problems = []
    if not stat.S_ISDIR(st.st_mode):
        problems.append("it is not a folder (a link or a file)")
    if st.st_uid != os.getuid():
        problems.append(f"it is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})")
    if st.st_mode & 0o022:
        problems.append(f"group or others may write to it (mode {stat.S_IMODE(st.st_mode):o}, expected no "
                        f"group/other write bit)")
    return problems


def private_fallback_root() -> Path:
    """:func:`fallback_root`, created with mode 0700 when absent, and refused unless it is a
    folder (not a link) this user owns and no one else may write to: its path is guessable in
    a shared temp dir, and a ``lib.so`` planted there would be loaded, i.e. run, by us.
    Raises :class:`CacheNotWritableError` naming ``AITER_MLA_CACHE_DIR`` otherwise."""
    root = fallback_root()
    try:
        os.mkdir(root, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise CacheNotWritableError(
            f"fallback JIT cache root {root} cannot be created ({exc.strerror or exc}): set "
            f"AITER_MLA_CACHE_DIR to a writable folder") from None
    problems = _private_dir_problems(root)
    if problems:
        raise CacheNotWritableError(
            f"fallback JIT cache root {root} is not safe to build in: {'; '.join(problems)}. A library "
            f"planted there would be loaded by this process: set AITER_MLA_CACHE_DIR to a folder of "
            f"your own")
    return root


def fallback_root_problem(probe_write: bool = False) -> str | None:
    """Why :func:`private_fallback_root` would refuse the fallback root, or None when it would
    take it: the problems of an existing one, or why a missing one cannot be created. Creates
    nothing, except the probe folder of ``probe_write`` (:func:`unmakeable_folder_reason`)."""
    root = fallback_root()
    try:
        if os.path.lexists(root):
            problems = _private_dir_problems(root)
            return "; ".join(problems) if problems else None
    except OSError as exc:
        return f"it cannot be read ({exc.strerror or exc})"
    return unmakeable_folder_reason(root, probe_write)


def existing_private_fallback_root() -> Path | None:
    """The fallback root when an earlier process created it and it passes the checks of
    :func:`private_fallback_root` (so lookups find what was built there), else None."""
    root = fallback_root()
    try:
        return None if _private_dir_problems(root) else root
    except OSError:
        return None


def atomic_write_text(path: Path, text: str, best_effort: bool = False) -> None:
    """Write ``path`` through a temp file and one rename; readers see old or new, never half.
    With ``best_effort``, a read-only location is silently skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError:
        if not best_effort:
            raise
        with contextlib.suppress(OSError, UnboundLocalError):
            tmp.unlink()


def _fsync_tree(folder: Path) -> None:
    for p in folder.iterdir():
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def file_sha256(path: Path) -> tuple[int, str]:
    """(size, sha256 hex) of a file. Reads through one small reused buffer: a fresh process
    pays page faults for every large new buffer, which cost more than the hashing here."""
    h = hashlib.sha256()
    buf = bytearray(1 << 16)
    view = memoryview(buf)
    size = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            size += n
            h.update(view[:n])
    return size, h.hexdigest()


def _filelock_kwargs() -> dict:
    import inspect

    import filelock

    params = inspect.signature(filelock.FileLock.__init__).parameters
    kw = {"thread_local": False}
    if "fallback_to_soft" in params:
        kw["fallback_to_soft"] = False  # a soft lock judges liveness by pid: never
    return kw


#: Names move_aside gives what it moves into trash/ (entries, staging and third-party folders).
_MOVED_ASIDE = re.compile(r".+\.\d+\.[0-9a-f]{8}")


def _remove_path(path: Path) -> None:
    """rmtree for a folder, unlink for anything else (a file or a link); errors ignored."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def is_cache_key(name: str) -> bool:
    """Whether ``name`` has the form of a cache key: a sha256 hex digest (:mod:`.key`)."""
    return len(name) == 64 and all(c in "0123456789abcdef" for c in name)


class Cache:
    """One cache root. ``explicit``: the root was named by the user, through ``origin``
    (``AITER_MLA_CACHE_DIR``, or ``--cache-dir`` of a command), which messages name."""

    def __init__(self, root: Path, explicit: bool, origin: str = "AITER_MLA_CACHE_DIR"):
        self.root = Path(root)
        self.explicit = explicit
        self.origin = origin
        self._lock_kw: dict | None = None
        self._by_id: tuple | None = None   # (entries/ stamp, {id: [(built_at, key)]})

    # ----- paths
    def entry_dir(self, key: str) -> Path:
        return self.root / "entries" / key

    @property
    def toolchains_dir(self) -> Path:
        return self.root / "toolchains"

    @property
    def third_party_dir(self) -> Path:
        return self.root / "third_party"

    def lock_path(self, key: str) -> Path:
        return self.root / "locks" / f"{key}.lock"

    # ----- reading (no lock needed: published entries are immutable)
    def read_entry(self, key: str, arch: str) -> Entry | Corrupt | None:
        """The verified entry of ``key``, a :class:`Corrupt` one, or None if absent.

        Verifies meta.json, the artifact's size and sha256, the key and the arch recorded
        at build time."""
        d = self.entry_dir(key)
        try:
            meta = json.loads((d / META).read_text())
        except (FileNotFoundError, NotADirectoryError):   # the latter: a file on the path
            # entries are published whole (one rename of a staging folder with meta.json in it),
            # so an entry folder without meta.json is damage, not a build in progress; so is a
            # file (or link) where the entry folder belongs (a file above it is the root's problem)
            if d.is_dir():   # a link to a folder counts as one, as in entries()
                return Corrupt(key, d, "meta.json missing")
            if os.path.lexists(d):
                return Corrupt(key, d, "not a folder")
            return None
        except (OSError, ValueError) as exc:
            if isinstance(exc, OSError) and not os.path.isdir(self.root):   # never raises
                return None   # the root's problem (e.g. a looping link), reported as such by the writer
            return Corrupt(key, d, f"meta.json unreadable: {exc}")
        if not isinstance(meta, dict):
            return Corrupt(key, d, f"meta.json holds a {type(meta).__name__}, not an object")
        try:
            art = meta["artifact"]
            if not isinstance(art, dict):
                return Corrupt(key, d, f"meta.json's artifact is a {type(art).__name__}, not an object")
            if not isinstance(art.get("name"), str):
                return Corrupt(key, d, f"meta.json's artifact name is {art.get('name')!r}, not a string")
            path = d / art["name"]
            if not isinstance(art["size"], int) or not isinstance(art["sha256"], str):
                return Corrupt(key, d, f"meta.json's artifact size and sha256 are "
                                       f"{art['size']!r} and {art['sha256']!r}, not an integer "
                                       f"and a string")
            # lib.so is what every loadable toolchain makes, code.hsaco the compile check's
            if bool(meta.get("loadable")) != (art["name"] == "lib.so"):
                return Corrupt(key, d, f"meta.json says loadable={meta.get('loadable')!r} for "
                                       f"an artifact named {art['name']!r}")
            if meta["key"] != key:
                return Corrupt(key, d, f"meta.json is for key {meta['key']}")
            if meta["arch"] != arch:
                return Corrupt(key, d, f"built for arch {meta['arch']}, wanted {arch}")
            size, digest = file_sha256(path)
        except FileNotFoundError:
            if not d.exists():
                return None  # moved away (rebuild/clear) while we read
            return Corrupt(key, d, "artifact file missing")
        except OSError as exc:   # e.g. the artifact's name is a folder
            return Corrupt(key, d, f"artifact unreadable: {exc}")
        except KeyError as exc:
            return Corrupt(key, d, f"meta.json lacks {exc}")
        except TypeError as exc:   # a field of the wrong type, e.g. key or arch a list
            return Corrupt(key, d, f"meta.json has a field of the wrong type ({exc})")
        if size != art["size"] or digest != art["sha256"]:
            return Corrupt(key, d, f"artifact is {size} bytes sha256 {digest[:12]}..., "
                                   f"meta.json says {art['size']} bytes {art['sha256'][:12]}...")
        return Entry(key, d, path, meta)

    def find_by_id(self, ident: str, arch: str, ids_of) -> Entry | Corrupt | None:
        """The newest verified entry (``built_at``, then the larger key) among those whose
        ``ids_of(meta)`` includes ``ident``; else the first damaged one; else None. Read-only:
        ``ids_of(meta)`` gives the ids a parsed meta.json answers to. Each meta.json is read
        once per process while ``entries/`` is unchanged (its mtime and inode)."""
        d = self.root / "entries"
        try:
            st = d.stat()
            stamp = (st.st_mtime_ns, st.st_ino, ids_of)
        except OSError:
            return None
        if self._by_id is None or self._by_id[0] != stamp:
            self._by_id = (stamp, self._scan_ids(d, ids_of))
        damaged = None
        for _, key in sorted(self._by_id[1].get(ident, ()), reverse=True):
            got = self.read_entry(key, arch)
            if isinstance(got, Entry):
                return got
            damaged = damaged or got
        return damaged

    @staticmethod
    def _scan_ids(entries: Path, ids_of) -> dict[str, list[tuple[float, str]]]:
        out: dict[str, list[tuple[float, str]]] = {}
        with contextlib.suppress(OSError):
            for d in entries.iterdir():
                if not is_cache_key(d.name):
                    continue
                try:
                    meta = json.loads((d / META).read_text())
                    built = float(meta.get("built_at") or 0.0)
                except (OSError, ValueError, TypeError, AttributeError):
                    continue   # damaged: found (and reported) only by its exact key
                for ident in ids_of(meta):
                    out.setdefault(ident, []).append((built, d.name))
        return out

    def read_index(self, lookup: str) -> str | None:
        try:
            key = (self.root / "index" / lookup).read_text().strip()
        except (OSError, ValueError):   # ValueError: not UTF-8 (damaged); rebuilt like a missing one
            return None
        return key if is_cache_key(key) else None

    def write_index(self, lookup: str, key: str) -> None:
        atomic_write_text(self.root / "index" / lookup, key, best_effort=True)

    def touch_used(self, key: str) -> None:
        """Stamp the entry's last use for LRU gc (skipped on a read-only cache)."""
        stamp = self.root / "used" / key
        try:
            os.utime(stamp)
        except FileNotFoundError:
            with contextlib.suppress(OSError):
                stamp.parent.mkdir(parents=True, exist_ok=True)
                stamp.touch()
        except OSError:
            pass

    # ----- writing
    def ensure_writable(self, for_loads: bool = True, create: bool = True) -> None:
        """Check that the cache can be written, creating the folders a build needs (``create``);
        raise :class:`CacheNotWritableError` naming ``AITER_MLA_CACHE_DIR`` when it cannot.
        ``for_loads``: the write serves a load (a build), so the message also offers
        ``AITER_MLA_DISABLE_JIT=1``; not for clear, gc or fetch. ``create=False`` (clear, gc):
        nothing is created; the folders the root already has must be folders and writable (the
        probe goes into entries/ when there is one, else the root), so a ``--cache-dir`` naming
        any folder gains none."""
        try:
            if create:
                for sub in _SUBDIRS:
                    (self.root / sub).mkdir(parents=True, exist_ok=True)
                probe = self.root / "staging" / f".probe.{os.getpid()}.{uuid.uuid4().hex[:8]}"
            else:
                for sub in _SUBDIRS:
                    folder = self.root / sub
                    if os.path.lexists(folder) and not folder.is_dir():   # a file named entries, say
                        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(folder))
                    if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
                        code = errno.EROFS if _read_only_mount(folder) else errno.EACCES
                        raise OSError(code, os.strerror(code), str(folder))
                where = self.root / "entries" if (self.root / "entries").is_dir() else self.root
                probe = where / f".probe.{os.getpid()}.{uuid.uuid4().hex[:8]}"
            probe.touch()
            probe.unlink()
        except OSError as exc:
            how = (f"{self.origin} points at it" if self.explicit
                   else "it is the default root")
            # name the path that failed when something there is in the way (a file named
            # entries, say); a plain permission error is the root's and is reported as such
            blocker = exc.filename and Path(exc.filename) != self.root and (
                exc.errno in (errno.EEXIST, errno.ENOTDIR) or Path(exc.filename).exists())
            where = f" at {exc.filename}" if blocker else ""
            if self.root.is_symlink() and not self.root.exists():
                where = f": a symlink to the missing {os.readlink(self.root)}"
            # the second way out only where it is one: loads already serve read-only roots, and
            # clear / gc / fetch write whatever AITER_MLA_DISABLE_JIT says
            loads_only = "" if env.get_flag("AITER_MLA_DISABLE_JIT") or not for_loads else (
                ", or AITER_MLA_DISABLE_JIT=1 to use only what the cache already holds")
            raise CacheNotWritableError(
                f"JIT cache root {self.root} is not writable ({exc.strerror or exc}{where}; {how}): "
                f"set {self.origin if self.explicit else 'AITER_MLA_CACHE_DIR'} to a writable "
                f"folder{loads_only}"
            ) from None

    @contextlib.contextmanager
    def lock(self, key: str, what: str, timeout: float | None = None):
        """Hold ``key``'s flock while building/publishing. Waiters log who waits for what
        every 10 s and give up after ``AITER_MLA_LOCK_TIMEOUT`` seconds. The lock dies with
        its holder (kernel flock), so a SIGKILLed builder never wedges the next caller."""
        import filelock

        if self._lock_kw is None:
            self._lock_kw = _filelock_kwargs()
        if timeout is None:
            timeout = env.get_float("AITER_MLA_LOCK_TIMEOUT", 900.0, minimum=0.0)
        path = self.lock_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        lk = filelock.FileLock(str(path), **self._lock_kw)
        start = time.monotonic()
        next_note = start + 2.0
        while True:
            waited = time.monotonic() - start
            try:
                lk.acquire(timeout=max(0.0, min(0.5, timeout - waited)), poll_interval=0.02)
                break
            except filelock.Timeout:
                now = time.monotonic()
                if now - start >= timeout:
                    raise LockTimeoutError(
                        f"pid {os.getpid()} gave up after {now - start:.0f} s waiting for {what}: "
                        f"lock {path} is held by {self._owner(key)}; raise "
                        f"AITER_MLA_LOCK_TIMEOUT if that build is slow, or stop that process"
                    ) from None
                if now >= next_note:
                    log.warning("aiter_mla: pid %d waiting %.0f s (of %.0f s) for %s: lock %s is "
                                "held by %s", os.getpid(), now - start, timeout, what, path,
                                self._owner(key))
                    next_note = now + 10.0
        owner = path.with_suffix(".owner")
        try:
            atomic_write_text(owner, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                                 "since": time.time(), "what": what}),
                              best_effort=True)
            yield
        finally:
            with contextlib.suppress(OSError):
                owner.unlink()
            lk.release()

    def _owner(self, key: str) -> str:
        try:
            o = json.loads(self.lock_path(key).with_suffix(".owner").read_text())
            return (f"pid {o['pid']} on {o['host']} ({o['what']}, "
                    f"{time.time() - o['since']:.0f} s ago)")
        except (OSError, ValueError, KeyError, TypeError):
            return "another process"

    def try_lock(self, key: str):
        """A held lock for ``key`` or None when another process holds it (never waits)."""
        import filelock

        if self._lock_kw is None:
            self._lock_kw = _filelock_kwargs()
        path = self.lock_path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            lk = filelock.FileLock(str(path), **self._lock_kw)
            lk.acquire(timeout=0)
        except filelock.Timeout:
            return None
        return lk

    def new_staging(self, key: str) -> Path:
        d = self.root / "staging" / f"{key}.{os.getpid()}.{uuid.uuid4().hex[:12]}"
        d.mkdir(parents=True)
        return d

    def remove_stale_staging(self, key: str) -> None:
        """Delete staging folders of ``key`` left by dead builders. Call with the key's lock
        held: then no live process is building into any of them."""
        with contextlib.suppress(FileNotFoundError):
            for d in (self.root / "staging").iterdir():
                if d.name.startswith(key + "."):
                    shutil.rmtree(d, ignore_errors=True)

    def move_aside(self, path: Path) -> None:
        """Rename ``path`` into trash/ (atomic), then delete it. A process that has the
        library loaded keeps its mapping."""
        trash = self.root / "trash" / f"{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        trash.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(path, trash)
        except FileNotFoundError:
            return
        _remove_path(trash)   # a folder, or a file / link where an entry folder belongs

    def publish(self, staging: Path, key: str, replace: bool) -> Path:
        """Make ``staging`` the entry of ``key`` with one rename (call with the lock held).
        With ``replace``, an existing entry is moved aside first (``rebuild``)."""
        _fsync_tree(staging)
        final = self.entry_dir(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        if replace:
            self.move_aside(final)
        try:
            os.rename(staging, final)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            self.move_aside(final)  # only a corrupt leftover can be here while we hold the lock
            os.rename(staging, final)
        _fsync_dir(final.parent)
        self.move_aside(self.root / "failed" / key)   # an earlier failure of this key is stale now
        return final

    def keep_failed(self, key: str, staging: Path, replace: bool = True) -> tuple[Path, bool]:
        """Keep a failed build's source and log under failed/<key>/ for inspection; return
        (the kept source path, whether it is an earlier build's). ``replace=False`` (an
        interrupted build) keeps a whole record already there, the key's last real failure,
        and drops the staging folder: the key fixes the source, so that record's is this
        build's."""
        dest = self.root / "failed" / key
        if not replace and (dest / "source.cu").is_file():
            shutil.rmtree(staging, ignore_errors=True)
            return dest / "source.cu", True
        self.move_aside(dest)
        try:
            os.rename(staging, dest)
        except OSError:
            return staging / "source.cu", False
        return dest / "source.cu", False

    # ----- listing, clearing, gc
    def entries(self) -> list[dict]:
        """Every published entry: key, path, bytes, last use, meta (None if unreadable).

        Only names of the form of a cache key (64 lowercase hex digits) are entries: anything
        else under ``entries/`` (a ``.DS_Store``, a user's folder when the cache variable points
        at an existing directory) is neither listed nor ever removed by ``clear`` / ``gc``. A
        key-named file or link (damage: entries are folders) is listed with meta None."""
        out = []
        try:
            names = sorted((self.root / "entries").iterdir())
        except FileNotFoundError:
            return out
        for d in names:
            if not is_cache_key(d.name):
                continue
            try:
                folder = d.is_dir()   # a link to a folder counts as one, as read_entry loads it
                try:
                    meta = json.loads((d / META).read_text()) if folder else None
                except (OSError, ValueError):
                    meta = None
                if not isinstance(meta, dict):   # a list, a string, or a key-named file: as unreadable
                    meta = None
                if folder:
                    size = sum(p.stat().st_size for p in d.iterdir() if p.is_file())
                else:   # a file or a dangling link
                    size = d.lstat().st_size
                try:
                    used = (self.root / "used" / d.name).stat().st_mtime
                except OSError:
                    used = d.lstat().st_mtime
            except OSError:   # removed by another process while listed
                continue
            out.append({"key": d.name, "path": d, "bytes": size, "last_used": used,
                        "meta": meta})
        return out

    def total_bytes(self) -> int:
        """Bytes of every file under the root."""
        total = 0
        for dirpath, _, files in os.walk(self.root):
            for f in files:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(dirpath, f)).st_size
        return total

    def remove_entry(self, key: str) -> bool | None:
        """Remove one entry unless its lock is held (a build, or another process's clear or
        gc); return True when this call removed it, False when the lock was held, None when it
        was already gone (another clear / gc took it first: counted once, by that one)."""
        lk = self.try_lock(key)
        if lk is None:
            return False
        try:
            if not os.path.lexists(self.entry_dir(key)):
                return None
            self.move_aside(self.entry_dir(key))
            with contextlib.suppress(OSError):
                (self.root / "used" / key).unlink()
        finally:
            lk.release()
        return True

    def sweep(self) -> None:
        """Delete leftovers no live process uses: staging folders whose key is not locked,
        trash, and index records pointing at missing entries. Lock files are kept."""
        with contextlib.suppress(FileNotFoundError):
            for d in (self.root / "staging").iterdir():
                key = d.name.split(".", 1)[0]
                if not is_cache_key(key):
                    continue
                lk = self.try_lock(key)
                if lk is not None:
                    try:
                        shutil.rmtree(d, ignore_errors=True)
                    finally:
                        lk.release()
        # Only what this package names (move_aside's NAME.<pid>.<8 hex>, index records named
        # by a key): the root may be a user's existing folder with a trash/ or index/ of its own.
        with contextlib.suppress(FileNotFoundError):
            for d in (self.root / "trash").iterdir():
                if _MOVED_ASIDE.fullmatch(d.name):
                    _remove_path(d)
        with contextlib.suppress(FileNotFoundError):
            for f in (self.root / "index").iterdir():
                if not is_cache_key(f.name):
                    continue
                key = self.read_index(f.name)
                if key is None or not self.entry_dir(key).exists():
                    with contextlib.suppress(OSError):
                        f.unlink()

    def failed_builds(self) -> list[Path]:
        """The kept failed builds (``failed/<key>``; nothing else there), [] when there is none."""
        try:
            return [d for d in (self.root / "failed").iterdir() if is_cache_key(d.name)]
        except FileNotFoundError:
            return []

    def clear_failed(self) -> None:
        """Delete the kept sources of failed builds (``failed/<key>``), nothing else there."""
        for d in self.failed_builds():
            _remove_path(d)

    def gc(self, max_bytes: int) -> dict:
        """Evict least-recently-used entries until the entries total at most ``max_bytes``;
        a locked entry is never evicted. Returns a report with the bytes and entries removed
        and the locked ones skipped."""
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        entries = sorted(self.entries(), key=lambda e: e["last_used"])
        total = sum(e["bytes"] for e in entries)
        removed, freed, skipped = [], 0, []
        for e in entries:
            if total <= max_bytes:
                break
            done = self.remove_entry(e["key"])
            if done is False:
                skipped.append(e["key"])
                continue
            total -= e["bytes"]   # gone either way
            if done:
                removed.append(e["key"])
                freed += e["bytes"]
        self.sweep()
        return {"removed": removed, "freed_bytes": freed, "skipped_locked": skipped,
                "remaining_bytes": total}
