"""Well-known credential files, left out of an upload unless the user takes one in (`--include`, docs/run.md).

A workdir is often a project folder or a home directory, and a `.gitignore` that misses a `.env` or an `id_rsa`
would put it on a stranger's host. A family is known by the file's name (shell patterns: `*.key`), by the end of
its path (`.aws/credentials`), or by a folder it sits in (`.config/gcloud/`); a name pattern never matches a
folder, so a virtualenv called `.env/` is not taken for a dotenv file. Two more are recognised by their first
bytes, whatever their name: a PEM, OpenSSH, PGP or PuTTY private key, and a cloud service-account key (JSON holding
a private key). Names are compared casefolded and NFKC-normalised, without invisible characters; contents after
a BOM.
"""

from __future__ import annotations

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
    "Hugging Face token": Family(path_ends=("huggingface/token",)),
    "password file": Family(names=(".pgpass", ".my.cnf")),
}
_HEAD_BYTES = 4096  # where a key file says what it is
_PEM_SCAN_BYTES = 65536  # a PEM bundle may put its key after a certificate chain
_JSON_SCAN_BYTES = 65536  # a service-account key is about 2.3 kB
_BOM = b"\xef\xbb\xbf"
# Any private key armour: PKCS#8, RSA, EC, OpenSSH, ENCRYPTED, and PGP's `PRIVATE KEY BLOCK`
_PRIVATE_ARMOUR = re.compile(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----")


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


def credential_content(path: Path) -> str | None:
    """What a regular file is by its first bytes: a private key (PEM, OpenSSH, PuTTY) or a cloud service-account
    key, else None. A file that cannot be read is not sniffed (the upload reads it again, and says so)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        head = os.read(fd, _HEAD_BYTES)
        text = head.removeprefix(_BOM).lstrip()  # OpenSSL and json readers skip a BOM: so does the check
        if text.startswith(b"-----BEGIN "):
            body = head + os.read(fd, _PEM_SCAN_BYTES - len(head))
            if _PRIVATE_ARMOUR.search(body):
                return "private key (by its content)"
        elif text.startswith(b"PuTTY-User-Key-File-"):
            return "private key (by its content)"
        elif text.startswith(b"{") and _service_account(head + os.read(fd, _JSON_SCAN_BYTES - len(head))):
            return "cloud credentials (by its content)"
    except OSError:
        return None
    finally:
        os.close(fd)
    return None
