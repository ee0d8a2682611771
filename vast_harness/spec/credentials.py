"""Well-known credential files, left out of an upload unless the user takes one in (`--include`, docs/run.md).

A workdir is often a project folder or a home directory, and a `.gitignore` that misses a `.env` or an `id_rsa`
would put it on a stranger's host. A family is known by the file's name (shell patterns: `*.key`), by the end of
its path (`.aws/credentials`), or by a folder it sits in (`.config/gcloud/`); a name pattern never matches a
folder, so a virtualenv called `.env/` is not taken for a dotenv file. Three more are recognised by their content,
whatever their name: a PEM, OpenSSH, PGP or PuTTY private key and a cloud service-account key (JSON holding a
private key) by their first bytes, and a text file that sets AWS keys (an ini, env, YAML or JSON line, compact
or pretty, setting `aws_secret_access_key` or `aws_session_token` to a literal; an STS answer's `SecretAccessKey`
or `SessionToken`; or an `AKIA`/`ASIA` key id with a secret beside it, as in the AWS console's CSV) by its
first 64 kB. Names are compared casefolded and NFKC-normalised, without invisible characters; contents after a
BOM, and a UTF-16 or UTF-32 file (known by its BOM: what PowerShell 5's `>` writes) as the text it holds.
"""

from __future__ import annotations

import codecs
import fnmatch
import json
import os
import re
import unicodedata
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, ConfigDict


class Family(BaseModel):
    """One kind of credential file: its names (shell patterns on the file's name; `keep`: names that match but
    are not credentials, such as templates), its path endings and the folders whose files are all credentials."""

    model_config = ConfigDict(frozen=True)

    names: tuple[str, ...] = ()
    keep: tuple[str, ...] = ()
    path_ends: tuple[str, ...] = ()
    folders: tuple[str, ...] = ()

    def matches(self, rel: str) -> bool:
        """`rel` as `credential_family` normalised it (casefolded, NFKC, invisible characters gone)."""
        path = PurePosixPath(rel)
        if any(fnmatch.fnmatchcase(path.name, p) for p in self.names) and \
                not any(fnmatch.fnmatchcase(path.name, k) for k in self.keep):
            return True
        parts = path.parts
        if any(parts[-len(end.split("/")):] == tuple(end.split("/")) for end in self.path_ends):
            return True
        folders = parts[:-1]
        return any(_contains(folders, tuple(f.split("/"))) for f in self.folders)


def _contains(parts: tuple[str, ...], run: tuple[str, ...]) -> bool:
    return any(parts[i:i + len(run)] == run for i in range(len(parts) - len(run) + 1))


FAMILIES: dict[str, Family] = {
    "dotenv file": Family(names=(".env", ".env.*", "*.env", ".envrc"),
                          keep=(".env.example", ".env.sample", ".env.template", ".env.dist")),
    "SSH private key": Family(names=("id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "id_ecdsa_sk", "id_ed25519_sk",
                                     "*.ppk")),
    "TLS private key": Family(names=("*.key", "*.p12", "*.pfx", "*.jks", "*.keystore")),
    "netrc": Family(names=(".netrc", "_netrc")),
    "cloud credentials": Family(names=("application_default_credentials.json",),
                                path_ends=(".aws/credentials", ".oci/config"), folders=(".config/gcloud", ".azure")),
    "registry credentials": Family(names=(".npmrc", ".pypirc"),
                                   path_ends=(".docker/config.json", ".gem/credentials", ".cargo/credentials",
                                              ".cargo/credentials.toml", ".config/gh/hosts.yml")),
    "git credentials": Family(names=(".git-credentials",)),
    "kube config": Family(names=("kubeconfig", "*.kubeconfig"), path_ends=(".kube/config",)),
    "Vast API key": Family(names=("vast_api_key", ".vast_api_key")),
    "Hugging Face token": Family(path_ends=("huggingface/token", ".huggingface/token", "huggingface/stored_tokens")),
    "Vault token": Family(names=(".vault-token",)),
    "password file": Family(names=(".pgpass", ".my.cnf")),
}
_HEAD_BYTES = 4096  # where a key file says what it is
_PEM_SCAN_BYTES = 65536  # a PEM bundle may put its key after a certificate chain
_JSON_SCAN_BYTES = 65536  # a service-account key is about 2.3 kB
_TEXT_SCAN_BYTES = 65536  # a config, env or ini file with an AWS key pair: small; a file with a NUL is not text
_BOM = b"\xef\xbb\xbf"
# The wide Unicode encodings, by their BOMs: UTF-32's first, as its little-endian BOM starts with UTF-16's. The
# account-key check (spec/workdir.py) looks for the key in each of them too.
WIDE_BOMS = ((codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be"),
             (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))
WIDE_CODECS = tuple(codec for _, codec in WIDE_BOMS)
# Any private key armour: PKCS#8, RSA, EC, OpenSSH, ENCRYPTED, and PGP's `PRIVATE KEY BLOCK`
_PRIVATE_ARMOUR = re.compile(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----")


# The names that set an AWS secret: the SDKs' and CLI's settings, and the STS answer's (`aws sts assume-role`).
# `SessionToken` is also a common name outside AWS: it counts only in a document that names an `AccessKeyId`.
_AWS_SECRET_NAMES = (b"aws_secret_access_key", b"aws_session_token", b"secretaccesskey", b"sessiontoken")
_AWS_SECRET_NAME = rb"(?P<name>" + b"|".join(_AWS_SECRET_NAMES) + rb")"
_STS_TOKEN, _STS_KEY_ID = b"sessiontoken", b"accesskeyid"
# A setting anywhere in a line (JSON, one line or pretty, a YAML flow map, a dict, a keyword argument): the name,
# quoted or not, `:` or `=`, and a quoted literal; a reference (`"${X}"`), a placeholder (`"<key>"`), a type
# (`"Optional[str]"`) or an empty value is not one. Any number of settings share a line.
_AWS_QUOTED_SETTING = re.compile(
    rb"(?i)(?<![A-Za-z0-9_])" + _AWS_SECRET_NAME +
    rb"""["']?[ \t]*[=:][ \t]*(?:"[^"\s$<>{}()\[\]]{8,}"|'[^'\s$<>{}()\[\]]{8,}')""")
# A line that sets one to an unquoted literal (ini, env, shell, YAML): a reference (`${X}`, `os.environ[...]`,
# `creds.secret`, `!GetAtt`) or a Python keyword argument (`=x,`) is not one.
_AWS_BARE_SETTING = re.compile(
    rb"""(?im)^[ \t]*(?:export[ \t]+)?["']?""" + _AWS_SECRET_NAME +
    rb"""["']?[ \t]*[=:][ \t]*[^\s"'$<>{}()\[\],;.#!]{8,}[ \t]*(?:#.*)?\r?$""")
_AWS_KEY_ID = re.compile(rb"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])")
_AWS_SECRET = re.compile(rb"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")
_AWS_NEAR_BYTES = 256  # a key id's secret sits on its line or the next (the console's CSV, a note)


def _aws_keys(text: bytes) -> bool:
    """An AWS secret access key or session token set to a literal (by the SDKs' names or the STS answer's), or a
    key id with a secret beside it (a 40 character base64 word with both cases: a hex digest is not one). The
    64 kB are searched only when they hold one of the names."""
    low = text.lower()
    if any(name in low for name in _AWS_SECRET_NAMES):
        sts = _STS_KEY_ID in low
        for rule in (_AWS_QUOTED_SETTING, _AWS_BARE_SETTING):
            if any(sts or m["name"].lower() != _STS_TOKEN for m in rule.finditer(text)):
                return True
    for key_id in _AWS_KEY_ID.finditer(text):
        near = text[max(0, key_id.start() - _AWS_NEAR_BYTES):key_id.end() + _AWS_NEAR_BYTES]
        if any(w.lower() != w and w.upper() != w for w in (m.group() for m in _AWS_SECRET.finditer(near))):
            return True
    return False


def _service_account(data: bytes) -> bool:
    """JSON holding `"type": "service_account"` and a `private_key`, parsed (a `\\u005f` escape is the same
    text); a document too big or broken is judged by its bytes."""
    try:
        doc = json.loads(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError):
        return b'"service_account"' in data and b'"private_key"' in data
    return isinstance(doc, dict) and doc.get("type") == "service_account" and "private_key" in doc


def name_key(name: str) -> str:
    """A path part as a rule compares it: NFKC (a fullwidth `．env` is `.env`), without format characters (a
    zero-width space, a soft hyphen), surrounding spaces gone, casefolded (`.ENV`, `Id_Ed25519`: on a
    case-insensitive disk, macOS's default, they are the very files the rules name)."""
    text = unicodedata.normalize("NFKC", name)
    return "".join(c for c in text if unicodedata.category(c) != "Cf").strip().casefold()


def credential_family(rel: str) -> str | None:
    """The family a file is by its name or place (`rel`: its posix path relative to the workdir), else None."""
    key = "/".join(name_key(part) for part in PurePosixPath(rel).parts)
    return next((name for name, family in FAMILIES.items() if family.matches(key)), None)


def _wide_text(head: bytes, fd: int) -> bytes | None:
    """The text of a file that starts with a UTF-16 or UTF-32 BOM, as UTF-8: its first 64 kB read on from `head`
    and decoded (a unit the read cut or a bad one is a replacement character), else None (no further read: the
    BOM test is all an ordinary file costs)."""
    for bom, codec in WIDE_BOMS:
        if head.startswith(bom):
            data = (head + os.read(fd, _TEXT_SCAN_BYTES - len(head)))[len(bom):]
            return data.decode(codec, "replace").encode("utf-8")
    return None


def credential_content(path: Path) -> str | None:
    """What a regular file is by its first bytes: a private key (PEM, OpenSSH, PuTTY), a cloud service-account
    key, or a text file (no NUL in its first 64 kB) that sets AWS keys, else None. A file that cannot be read is
    not sniffed (the upload reads it again, and says so)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        head = os.read(fd, _HEAD_BYTES)
        wide = _wide_text(head, fd)

        def more(n_bytes: int) -> bytes:  # a wide file's 64 kB are read and decoded already
            return b"" if wide is not None or n_bytes <= 0 else os.read(fd, n_bytes)

        head = head if wide is None else wide
        text = head.removeprefix(_BOM).lstrip()  # OpenSSL and json readers skip a BOM: so does the check
        if text.startswith(b"-----BEGIN "):
            body = head + more(_PEM_SCAN_BYTES - len(head))
            if _PRIVATE_ARMOUR.search(body):
                return "private key (by its content)"
            head = body
        elif text.startswith(b"PuTTY-User-Key-File-"):
            return "private key (by its content)"
        elif text.startswith(b"{"):
            head += more(_JSON_SCAN_BYTES - len(head))
            if _service_account(head):
                return "cloud credentials (by its content)"
        if b"\0" not in head[:_HEAD_BYTES]:
            body = head + more(_TEXT_SCAN_BYTES - len(head))
            if b"\0" not in body and _aws_keys(body):
                return "cloud credentials (by its content)"
    except OSError:
        return None
    finally:
        os.close(fd)
    return None
