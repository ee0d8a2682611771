"""The user's workdir as `vast-e2e run` uploads it, and the artifact globs it pulls back (docs/run.md).

What is uploaded: every regular file under the workdir except `.git/`, what the workdir's `.gitignore` files
ignore (read with `pathspec`, git's own rules, nested files included) and what `--exclude` names. Never the API
key file the run was given, the official CLI's key file, or the harness's own config, state and evidence
directories (`NeverUpload`, matched by device and inode, so another path to them does not get them up either);
and not well-known credential files (`spec/credentials.py`) unless `--include` takes one in. Each of these is
named (`LeftOut`), for the dry run, the console and the record. Nor a file whose bytes hold the account key,
whatever its name (a copy of the key file), in UTF-8, UTF-16 or UTF-32: found as the upload reads it, and named
the same way; nor a file or folder whose name holds it (a name goes up as it is), named with the key masked. Symlinks are
never followed or uploaded: one could point the upload at a key outside the workdir. The total is held to a size limit, and a workdir over it is
bad input (exit 2, nothing rented) that names the limit, the size and the largest files; so is a folder or file
the walk cannot read (a path over PATH_MAX, a folder it may not list), named. Artifact globs are
checked here too, before renting: relative to the workdir, no `..`, balanced brackets.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path, PurePosixPath

import pathspec
from pydantic import BaseModel, ConfigDict

from vast_harness.errors import ConfigError
from vast_harness.records import WorkdirLeftOut as LeftOut
from vast_harness.redact import MASK, written_forms
from vast_harness.spec.credentials import WIDE_CODECS, credential_content, credential_family, name_key

DEFAULT_WORKDIR_MAX_MB = 100.0  # an upload of source and small data; bigger data belongs in the setup's download
MAX_WORKDIR_MAX_MB = 10_000.0
MB = 1_000_000
MAX_WORKDIR_FILES = 50_000  # a workdir with more is almost surely a virtualenv or a dataset left in by mistake
_ALWAYS_EXCLUDED = (".git/",)
_LARGEST_SHOWN = 5
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
KEY_COPY = "holds the account's API key"  # a file whose bytes hold it, whatever its name: never uploaded
_MIN_KEY_CHARS = 8  # a shorter "key" (a test's, a typo) would match ordinary files; a Vast key is 64
KEY_IN_NAME = "its name holds the account's API key"  # a name goes up as it is: never uploaded either
_SCAN_CHUNK = 1 << 20
_SHOWN_CHARS = 160  # a path in an error line longer than this is shortened: long names cut, middle folders counted
_SHOWN_PART_CHARS = 24
_SHOWN_HEAD_CHARS = 60
_HINT_CHARS = 80  # an --exclude hint longer than this names the path's first folder instead


class WorkdirFile(BaseModel):
    model_config = ConfigDict(frozen=True)

    rel: str  # posix path relative to the workdir
    bytes: int


class NeverUpload(BaseModel):
    """A file or folder of the user's that no upload takes, whatever the flags say: the API key file, the
    harness's own config and state. `why` names it to the user."""

    model_config = ConfigDict(frozen=True)

    path: Path
    why: str


class WorkdirSelection(BaseModel):
    """The files `run` uploads from a workdir; how many were left out by .gitignore and --exclude; and, by name,
    what was left out for being a key, a credential or the harness's own (`left_out`), the credential files
    `--include` took in (`included`), and the symlinks skipped."""

    model_config = ConfigDict(frozen=True)

    root: Path
    files: list[WorkdirFile]
    excluded: int = 0
    symlinks: list[str] = []
    left_out: list[LeftOut] = []
    included: list[str] = []

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.files)


def check_glob(flag: str, glob: str, *, anchored_ok: bool = False) -> str:
    """A glob relative to the workdir (`*.pt`, `out/**/*.json`, `checkpoints`): refused when absolute, when it
    climbs out with `..`, is empty, negated, has unbalanced brackets or control characters. `anchored_ok`: a
    leading `/` anchors the pattern at the workdir, as in .gitignore (--exclude); artifacts are anchored anyway."""
    text = glob.strip()
    if not text:
        raise ConfigError(f"{flag}: an empty glob; give a path pattern relative to the workdir, e.g. 'out/*.json'")
    if _CONTROL.search(text):
        raise ConfigError(f"{flag} {glob!r}: control characters are not allowed in a glob")
    anchor = anchored_ok and text.startswith("/") and not text.startswith("//")  # .gitignore's `/data`
    if (text.startswith(("/", "~")) and not anchor) or re.match(r"^[A-Za-z]:[\\/]", text):
        raise ConfigError(f"{flag} {glob!r}: must be relative to the workdir, not an absolute path")
    if "\\" in text:
        raise ConfigError(f"{flag} {glob!r}: use / between path parts (a backslash is not a separator on the host)")
    if ".." in PurePosixPath(text).parts:
        raise ConfigError(f"{flag} {glob!r}: '..' would leave the workdir; a glob names files inside it")
    if text.startswith("!"):
        raise ConfigError(f"{flag} {glob!r}: a negated glob ('!') is not supported here; name what you want")
    depth = 0
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0) if depth or char == "[" else 0
        if depth > 1:
            raise ConfigError(f"{flag} {glob!r}: nested '[' in a glob")
    if depth != 0:
        raise ConfigError(f"{flag} {glob!r}: an unclosed '[' (a character class needs its ']')")
    return text


class ArtifactGlobs:
    """Globs anchored at the workdir: `*`, `?` and `[...]` stay within one path part, `**` crosses parts, and a
    glob naming a folder takes everything in it (git's wildmatch rules, through `pathspec`)."""

    def __init__(self, globs: Sequence[str]) -> None:
        self.globs = [check_glob("--artifact", g) for g in globs]
        self._specs = [pathspec.GitIgnoreSpec.from_lines([f"/{g}"]) for g in self.globs]

    def matching(self, rel: str) -> list[str]:
        """The globs that select this file (posix path relative to the workdir)."""
        return [g for g, spec in zip(self.globs, self._specs, strict=True) if spec.match_file(rel)]


def size_text(n_bytes: float) -> str:
    """Bytes for people, in decimal units as the limit is given: 950 B, 12.3 kB, 104.9 MB, 2.1 GB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes:.0f} B"


def _largest(files: Iterable[WorkdirFile]) -> str:
    top = sorted(files, key=lambda f: (-f.bytes, f.rel))[:_LARGEST_SHOWN]
    return ", ".join(f"{f.rel} ({size_text(f.bytes)})" for f in top)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.expanduser().stat()
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


class KeyNeedles:
    """The account keys as a file's bytes or a name may hold them: each form the masker knows a key in
    (`redact.written_forms`: its Unicode normal forms, its escapes), encoded as UTF-8 and as UTF-16 and UTF-32
    (either byte order; a BOM or none, the needle is found either way). A needle with a NUL byte (a wide form of
    an ASCII key) is looked for only in data that has one, so text costs one more scan, not four."""

    def __init__(self, account_keys: Iterable[str]) -> None:
        keys = [k for k in dict.fromkeys(account_keys) if len(k) >= _MIN_KEY_CHARS]
        # longest first: the masked name shows `***` for the whole key, not for a part of it
        self.forms = sorted({f for k in keys for f in written_forms(k) if len(f) >= _MIN_KEY_CHARS},
                            key=len, reverse=True)
        needles = {f.encode("utf-8", "surrogateescape") for f in self.forms}
        needles |= {f.encode(codec, "surrogatepass") for f in self.forms for codec in WIDE_CODECS}
        self.narrow = tuple(sorted(n for n in needles if b"\0" not in n))
        self.wide = tuple(sorted(n for n in needles if b"\0" in n))
        self.longest = max(map(len, needles), default=0)

    def __bool__(self) -> bool:
        return bool(self.forms)

    def held_by(self, data: bytes) -> bool:
        return any(n in data for n in self.narrow) or (b"\0" in data and any(n in data for n in self.wide))

    def in_name(self, name: str) -> str | None:
        """A path part as it would be shown with the key masked (`name-***`), when it holds a key as it is
        written or as it is read (NFKC, without the characters that draw nothing: the masker's reading of a
        line), else None."""
        drawn = "".join(c for c in name if unicodedata.category(c) != "Cf")
        for view in dict.fromkeys((name, unicodedata.normalize("NFKC", drawn))):
            if any(form in view for form in self.forms):
                for form in self.forms:
                    view = view.replace(form, MASK)
                return view
        return None


def key_needles(account_keys: Iterable[str]) -> KeyNeedles:
    return KeyNeedles(account_keys)


def holds_key(data: bytes, needles: KeyNeedles) -> bool:
    return needles.held_by(data)


def file_holds_key(path: Path, needles: KeyNeedles) -> bool:
    """Whether the file's bytes hold an account key, read in chunks (a key across two is found); a file that
    cannot be read is not (the upload reads it again, and says so)."""
    if not needles:
        return False
    overlap = needles.longest - 1
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        tail = b""
        while chunk := os.read(fd, _SCAN_CHUNK):
            if holds_key(tail + chunk, needles):
                return True
            tail = (tail + chunk)[-overlap:] if overlap else b""
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


def left_out_lines(left_out: Sequence[LeftOut]) -> list[str]:
    """What the console and the dry run say about the files left out by name, one line each."""
    return [f"{item.path} ({item.why}" + ("; --include PATH to upload it)" if item.includable else ")")
            for item in left_out]


def _short_path(rel: str) -> str:
    """A path for an error line: a long one with its long names cut in the middle and, deep, its first folders
    and its last two with the count of those between."""
    if len(rel) <= _SHOWN_CHARS:
        return rel
    parts = [p if len(p) <= _SHOWN_PART_CHARS else f"{p[:12]}…{p[-8:]}" for p in rel.split("/")]
    head = 2
    while head < len(parts) - 2 and len("/".join(parts[:head + 1])) <= _SHOWN_HEAD_CHARS:
        head += 1
    if len(parts) - head > 3:
        parts = [*parts[:head], f"…{len(parts) - head - 2} more…", *parts[-2:]]
    return "/".join(parts)


def _too_long(path: Path) -> str:
    """Why the system called a path too long: the whole path (PATH_MAX) or one name in it (NAME_MAX)."""
    limits = {}
    for name in ("PATH_MAX", "NAME_MAX"):
        try:
            limits[name] = os.pathconf("/", f"PC_{name}")
        except (OSError, ValueError):
            limits[name] = {"PATH_MAX": 4096, "NAME_MAX": 255}[name]  # Linux's
    longest = max(path.parts, key=lambda part: len(os.fsencode(part)))
    if len(os.fsencode(longest)) > limits["NAME_MAX"]:
        return (f"a name in it is {len(os.fsencode(longest)):,} bytes, over the system's limit of "
                f"{limits['NAME_MAX']:,} (NAME_MAX)")
    return f"its path is {len(os.fsencode(path)):,} bytes, over the system's limit of {limits['PATH_MAX']:,} (PATH_MAX)"


def _unreadable(flag: str, root: Path, rel: str, exc: OSError, *, is_dir: bool) -> ConfigError:
    """A workdir entry the walk cannot read: bad input before anything is rented, naming it (shortened) and why
    (an upload that skipped it would run the command on other files than the user's)."""
    full = root / rel if rel else root
    why = exc.strerror or str(exc)
    if exc.errno == errno.ENAMETOOLONG:
        why = _too_long(full)
    if not rel:
        return ConfigError(f"{flag} {_short_path(str(root))}: cannot read it: {why}")
    parts = rel.split("/")
    hint = rel + ("/" if is_dir else "") if len(rel) <= _HINT_CHARS or len(parts) == 1 else parts[0] + "/"
    return ConfigError(f"{flag} {root}: cannot read {_short_path(rel)}: {why}; leave it out with .gitignore or "
                       f"--exclude '{hint}'")


def _refuse_inside(root: Path, never: Sequence[NeverUpload], flag: str) -> None:
    """A workdir that is one of the never-uploaded folders, or lies inside one, would upload it whole (the
    ledger, earlier runs' artifacts): bad input. Matched by device and inode, as the walk matches them."""
    places = {ident: place for place in (root, *root.parents) if (ident := _identity(place)) is not None}
    for item in never:
        ident = _identity(item.path)
        if ident is not None and ident in places:
            where = "is" if places[ident] == root else f"is inside {item.path.expanduser()},"
            raise ConfigError(f"{flag} {root}: {where} {item.why}; it never leaves this machine (it holds what "
                              "earlier runs left, keys among them): give your project's folder instead")


def select_workdir(root: Path, *, exclude: Sequence[str] = (), include: Sequence[str] = (),
                   max_mb: float = DEFAULT_WORKDIR_MAX_MB, skip_dirs: Sequence[Path] = (),
                   never_upload: Sequence[NeverUpload] = (), account_keys: Sequence[str] = (),
                   flag: str = "--workdir") -> WorkdirSelection:
    """The files to upload, sorted; ConfigError naming the problem (missing, not a folder, over the limit, an
    --exclude or --include that matches nothing, an --include of what is never uploaded). `skip_dirs`: the
    harness's own state and evidence dirs; `never_upload`: those and the key files, each with its reason;
    `account_keys`: a credential file that holds one is never uploaded (other files are scanned as the
    upload reads them: `host/bundle.py`)."""
    if not str(root).strip():
        raise ConfigError(f"{flag} is empty: give a folder ('.' for the current one)")
    root = root.expanduser()
    try:
        mode = root.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise ConfigError(f"{flag} {root}: no such folder") from None
    except OSError as exc:  # a symlink loop, a path too long, a parent it may not search
        raise _unreadable(flag, root, "", exc, is_dir=True) from None
    if not stat.S_ISDIR(mode):
        raise ConfigError(f"{flag} {root}: not a folder")
    root = root.resolve()
    never = [NeverUpload(path=d, why="the harness's own state or evidence directory") for d in skip_dirs]
    never_by_id: dict[tuple[int, int], str] = {}
    for item in [*never_upload, *never]:  # the first reason given for a path is the one said
        if (ident := _identity(item.path)) is not None:
            never_by_id.setdefault(ident, item.why)
    _refuse_inside(root, [*never_upload, *never], flag)
    excludes = {g: pathspec.GitIgnoreSpec.from_lines([g])
                for g in (check_glob("--exclude", g, anchored_ok=True) for g in exclude)}
    includes = {g: pathspec.GitIgnoreSpec.from_lines([g])
                for g in (check_glob("--include", g, anchored_ok=True) for g in include)}
    excludes_used: set[str] = set()
    includes_used: set[str] = set()
    # .gitignore files apply to the folder they sit in; --exclude and .git/ to the whole workdir.
    ignores: list[tuple[str, pathspec.GitIgnoreSpec]] = [("", pathspec.GitIgnoreSpec.from_lines(_ALWAYS_EXCLUDED))]
    files: list[WorkdirFile] = []
    symlinks: list[str] = []
    left_out: list[LeftOut] = []
    included: list[str] = []
    excluded = 0

    def ignored(rel: str, is_dir: bool) -> bool:
        path = rel + "/" if is_dir else rel
        hits = {g for g, spec in excludes.items() if spec.match_file(path)}
        excludes_used.update(hits)
        return bool(hits) or any(spec.match_file(path[len(base):]) for base, spec in ignores if path.startswith(base))

    def never_why(st: os.stat_result, rel: str) -> str | None:
        why = never_by_id.get((st.st_dev, st.st_ino))
        if why is not None:
            refused = [g for g, spec in includes.items() if spec.match_file(rel)]
            if refused:
                raise ConfigError(f"--include {refused[0]}: {rel} in {root} is {why}; it is never uploaded (put "
                                  "what the host needs in a --remote-secret instead)")
        return why

    needles = key_needles(account_keys)

    def key_named(base: str, name: str, is_dir: bool) -> str | None:
        """The path to name, the key masked, when this name holds an account key (its folder's cannot: a folder
        so named is not walked); an --include that takes it in is bad input."""
        masked = needles.in_name(name) if needles else None
        if masked is None:
            return None
        slash = "/" if is_dir else ""
        shown = base + masked + slash
        taken = [g for g, spec in includes.items() if spec.match_file(base + name + slash)]
        if taken:
            raise ConfigError(f"--include {taken[0]}: {shown} in {root}: {KEY_IN_NAME}; it is never uploaded "
                              "(rename it)")
        return shown

    def credential(path: Path, rel: str) -> tuple[str, bool] | None:
        why = credential_family(rel) or credential_content(path)
        if why is None:
            return None
        taken = {g for g, spec in includes.items() if spec.match_file(rel)}
        if file_holds_key(path, needles):
            if taken:
                raise ConfigError(f"--include {sorted(taken)[0]}: {rel} in {root} {KEY_COPY}; it is never uploaded "
                                  "(put what the host needs in a --remote-secret instead)")
            return KEY_COPY, False
        if taken:
            includes_used.update(taken)
            included.append(rel)
            return None
        return why, True

    def entry(path: Path, rel: str, *, is_dir: bool) -> os.stat_result | None:
        """The entry's own status (a symlink not followed); None when it went since its folder was listed, or
        cannot be read but is left out anyway (.gitignore, --exclude: counted as such)."""
        nonlocal excluded
        try:
            return os.lstat(path)
        except FileNotFoundError:
            return None
        except OSError as exc:  # a path longer than PATH_MAX, a permission, I/O
            if ignored(rel, is_dir=is_dir):
                excluded += 1
                return None
            raise _unreadable(flag, root, rel, exc, is_dir=is_dir) from None

    def walk_error(exc: OSError) -> None:
        """A folder os.walk could not list: gone (or no longer a folder) since its parent was listed is nothing
        to upload; else bad input, as a file the upload cannot read is."""
        if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
            return
        rel = Path(exc.filename).relative_to(root).as_posix() if exc.filename is not None else ""
        raise _unreadable(flag, root, "" if rel == "." else rel, exc, is_dir=True)

    for dirpath, dirnames, filenames in os.walk(root, onerror=walk_error, followlinks=False):
        here = Path(dirpath)
        base = here.relative_to(root).as_posix()
        base = "" if base == "." else base + "/"
        gitignore = here / ".gitignore"
        if ".gitignore" in filenames and (st := entry(gitignore, base + ".gitignore", is_dir=False)) is not None \
                and stat.S_ISREG(st.st_mode):
            try:
                lines = gitignore.read_text(encoding="utf-8", errors="replace").splitlines()
            except OSError as exc:
                raise ConfigError(f"{flag}: cannot read {gitignore}: {exc.strerror or exc}") from None
            ignores.append((base, pathspec.GitIgnoreSpec.from_lines(lines)))
        kept = []
        for name in sorted(dirnames):
            rel = base + name
            if (st := entry(here / name, rel, is_dir=True)) is None:
                continue
            if stat.S_ISLNK(st.st_mode):
                symlinks.append(rel)
            elif (why := never_why(st, rel + "/")) is not None:
                left_out.append(LeftOut(path=rel + "/", why=why, includable=False))
            elif name_key(name) == ".git" or ignored(rel, is_dir=True):  # `.GIT` is git's own on macOS's disk
                excluded += 1
            elif (shown := key_named(base, name, is_dir=True)) is not None:
                left_out.append(LeftOut(path=shown, why=KEY_IN_NAME, includable=False))
            else:
                kept.append(name)
        dirnames[:] = kept
        for name in sorted(filenames):
            rel = base + name
            path = here / name
            if (st := entry(path, rel, is_dir=False)) is None:
                continue
            if stat.S_ISLNK(st.st_mode):
                symlinks.append(rel)
            elif not stat.S_ISREG(st.st_mode):
                continue  # a FIFO, a socket, a device: nothing to upload
            elif (why := never_why(st, rel)) is not None:
                left_out.append(LeftOut(path=rel, why=why, includable=False))
            elif ignored(rel, is_dir=False):
                excluded += 1
            elif (shown := key_named(base, name, is_dir=False)) is not None:
                left_out.append(LeftOut(path=shown, why=KEY_IN_NAME, includable=False))
            elif (cred := credential(path, rel)) is not None:
                left_out.append(LeftOut(path=rel, why=cred[0], includable=cred[1]))
            else:
                files.append(WorkdirFile(rel=rel, bytes=st.st_size))
                if len(files) > MAX_WORKDIR_FILES:
                    raise ConfigError(f"{flag} {root}: more than {MAX_WORKDIR_FILES} files to upload (a virtualenv or "
                                      "a dataset?); leave them out with .gitignore or --exclude")
    unused = [g for g in excludes if g not in excludes_used]
    if unused:  # checkable before renting, unlike an artifact: most likely a typo
        raise ConfigError(f"--exclude {unused[0]!r} matches nothing in {root}; check the glob (relative to the "
                          "workdir, e.g. 'data/' or '*.ckpt')")
    unused = [g for g in includes if g not in includes_used]
    if unused:
        raise ConfigError(f"--include {unused[0]!r} matches no file left out as a credential in {root} (it takes "
                          "in a credential file the upload leaves out by default, e.g. '.env'; .gitignore and "
                          "--exclude are yours to change)")
    selection = WorkdirSelection(root=root, files=sorted(files, key=lambda f: f.rel), excluded=excluded,
                                 symlinks=sorted(symlinks), left_out=sorted(left_out, key=lambda i: i.path),
                                 included=sorted(included))
    if selection.total_bytes > max_mb * MB:
        raise ConfigError(f"{flag} {root}: {size_text(selection.total_bytes)} to upload is over the "
                          f"{max_mb:g} MB limit (--workdir-max-mb); largest: {_largest(selection.files)}. Leave "
                          "files out with .gitignore or --exclude, or raise the limit")
    if not selection.files:
        raise ConfigError(f"{flag} {root}: nothing to upload (every file is ignored or excluded)")
    return selection
