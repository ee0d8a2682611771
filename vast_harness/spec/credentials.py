"""Well-known credential files, left out of an upload unless the user takes one in (`--include`, docs/run.md).

A workdir is often a project folder or a home directory, and a `.gitignore` that misses a `.env` or an `id_rsa`
would put it on a stranger's host. Each family is a list of `.gitignore`-syntax patterns (matched like
`--exclude`, at any depth unless anchored); two more are recognised by their first bytes, whatever their name: a
PEM or PuTTY private key, and a cloud service-account key (JSON holding a private key).
"""

from __future__ import annotations

import os
from pathlib import Path

import pathspec

# family -> patterns (.gitignore syntax; a `!` line keeps what an earlier line of its family matched)
FAMILIES: dict[str, tuple[str, ...]] = {
    "dotenv file": (".env", ".env.*", "*.env", ".envrc",
                    "!.env.example", "!.env.sample", "!.env.template", "!.env.dist"),
    "SSH private key": ("id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "id_ecdsa_sk", "id_ed25519_sk", "*.ppk"),
    "TLS private key": ("*.key", "*.p12", "*.pfx", "*.jks", "*.keystore"),
    "netrc": (".netrc", "_netrc"),
    "cloud credentials": ("**/.aws/credentials", "**/.config/gcloud/", "application_default_credentials.json",
                          "**/.azure/", "**/.oci/config"),
    "registry credentials": ("**/.docker/config.json", ".npmrc", ".pypirc", "**/.gem/credentials",
                             "**/.cargo/credentials", "**/.cargo/credentials.toml", "**/.config/gh/hosts.yml"),
    "git credentials": (".git-credentials",),
    "kube config": ("**/.kube/config", "kubeconfig", "*.kubeconfig"),
    "Vast API key": ("vast_api_key", ".vast_api_key"),
    "Hugging Face token": ("**/huggingface/token",),
    "password file": (".pgpass", ".my.cnf"),
}
_SPECS = {family: pathspec.GitIgnoreSpec.from_lines(lines) for family, lines in FAMILIES.items()}
_HEAD_BYTES = 4096  # where a key file says what it is
_PEM_SCAN_BYTES = 65536  # a PEM bundle may put its key after a certificate chain


def credential_family(rel: str) -> str | None:
    """The family whose name pattern matches `rel` (a posix path relative to the workdir), else None."""
    return next((family for family, spec in _SPECS.items() if spec.match_file(rel)), None)


def credential_content(path: Path) -> str | None:
    """What a regular file is by its first bytes: a private key (PEM, OpenSSH, PuTTY) or a cloud service-account
    key, else None. A file that cannot be read is not sniffed (the upload reads it again, and says so)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        head = os.read(fd, _HEAD_BYTES)
        text = head.lstrip()
        if text.startswith(b"-----BEGIN "):
            body = head + os.read(fd, _PEM_SCAN_BYTES - len(head))
            if b"PRIVATE KEY-----" in body:
                return "private key (by its content)"
        elif text.startswith(b"PuTTY-User-Key-File-"):
            return "private key (by its content)"
        elif text.startswith(b"{") and b'"service_account"' in head and b'"private_key"' in head:
            return "cloud credentials (by its content)"
    except OSError:
        return None
    finally:
        os.close(fd)
    return None
