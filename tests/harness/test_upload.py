"""What goes up to the rented host (issue 43, items 1, 4 and 7): never the account key, the official CLI's key file
or the harness's own directories; well-known credential files only when the user takes one in (`--include`),
each left-out path named in the dry run, on the console and in the record; and inputs that would have uploaded
the wrong thing or run with the wrong cap refused as bad input (exit 2, `ConfigError`) naming the field.

The runs go through the embedded simulator's hosts over real SSH; the host's copy of what it received (the
unpacked workdir and the uploaded tarball, decompressed) is searched for every secret's bytes.
"""

from __future__ import annotations

import codecs
import errno
import gzip
import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from tests.harness.clirun import SIM_PACING_SCALE, cli
from vast_harness.errors import ConfigError, ExitCode
from vast_harness.sim import SimServer
from vast_harness.spec.workdir import select_workdir

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny-train"
SIM_OPTIONS = dict(seed=43, rate_scale=0.01, num_offers=50)  # conftest.sim
ACCOUNT_KEY = "c0ffee43" * 8  # a 64-hex API key: its bytes must never be on the host
# Copies what the host holds (its home: the tarball and the unpacked workdir) out, for the test to search.
COPY_HOST = 'mkdir -p "$OUT" && cp -r ~/vh ~/vh-bundle.tar.gz "$OUT"/'

# One file per well-known credential family (issue 43 item 4), each with bytes found nowhere else.
CREDENTIALS = {
    ".env": "dotenv file",
    "config/.env.production": "dotenv file",
    ".envrc": "dotenv file",
    "id_rsa": "SSH private key",
    ".ssh/id_ed25519": "SSH private key",
    "certs/server.key": "TLS private key",
    "deploy_key": "private key (by its content)",
    ".netrc": "netrc",
    ".aws/credentials": "cloud credentials",
    ".config/gcloud/application_default_credentials.json": "cloud credentials",
    "gcp-sa.json": "cloud credentials (by its content)",
    ".docker/config.json": "registry credentials",
    ".npmrc": "registry credentials",
    ".pypirc": "registry credentials",
    ".git-credentials": "git credentials",
    ".kube/config": "kube config",
    ".vault-token": "Vault token",
    ".huggingface/token": "Hugging Face token",
    "aws.ini": "cloud credentials (by its content)",
}
KEPT = [".env.example", "train.py", "keys.py", "server.pub"]  # look-alikes that are not credentials


def _secret(rel: str) -> str:
    return f"SECRET-{rel.replace('/', '_')}-91d3"


def _credential_workdir(root: Path) -> Path:
    for rel in CREDENTIALS:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        body = _secret(rel)
        if rel == "deploy_key":
            body = f"-----BEGIN OPENSSH PRIVATE KEY-----\n{body}\n-----END OPENSSH PRIVATE KEY-----\n"
        elif rel == "aws.ini":  # an AWS key pair, whatever the file's name (the example's, AWS's documented one)
            body = ("[default]\naws_access_key_id = AKIAIOSFODNN7EXAMPLE\n"
                    f"aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n# {body}\n")
        elif rel == "gcp-sa.json":
            body = json.dumps({"type": "service_account", "project_id": "p", "private_key_id": "1",
                               "private_key": f"-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----\n"})
        path.write_text(body)
    for rel in KEPT:
        (root / rel).write_text(f"kept {rel}\n")
    return root


def _host_bytes(copy: Path) -> bytes:
    """Every byte the host held: its files, and the uploaded tarball decompressed."""
    blobs = []
    for path in sorted(p for p in copy.rglob("*") if p.is_file()):
        data = path.read_bytes()
        blobs.append(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    return b"\n".join(blobs)


def _record(evidence: Path) -> dict:
    (run_dir,) = [d for d in evidence.iterdir() if d.is_dir() and (d / "harness-result.json").exists()]
    return json.loads((run_dir / "harness-result.json").read_text())


def _run(*args: str, sim: SimServer, **kwargs) -> subprocess.CompletedProcess[str]:
    """`vast-e2e run ARGS` against the module's simulator: its flags go before the `--` that starts the command."""
    at = args.index("--")
    return cli("run", *args[:at], "--api-url", sim.url, "--pacing-scale", SIM_PACING_SCALE, *args[at:], **kwargs)


def _sim_run(*args: str, **kwargs) -> subprocess.CompletedProcess[str]:
    """`vast-e2e run --sim ARGS`: a real run on the embedded simulator, whose clocks are scaled. Against the
    module's simulator (`--api-url`) a run keeps Vast's 30 s read-lag window, which its absence proof waits out."""
    return cli("run", "--sim", *args, **kwargs)


def _said(p: subprocess.CompletedProcess[str]) -> str:
    """What the command printed, as one line: the console wraps at its width."""
    return " ".join((p.stdout + p.stderr).split())


def _private(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o600)
    return path


# ----------------------------------------------------------------------------------------- the account key


def test_the_key_file_in_the_workdir_is_never_uploaded_and_is_named(tmp_path):
    """`--key-file proj/vast.key --workdir proj`: the key the run was given never reaches the host (not in the
    tarball, not unpacked, so `--artifact vast.key` has nothing to bring back) and the run says so by name."""
    proj = tmp_path / "proj"
    (proj / "train.py").parent.mkdir(parents=True)
    (proj / "train.py").write_text("print('trained')\n")
    _private(proj / "vast.key", ACCOUNT_KEY + "\n")
    host = tmp_path / "host"
    evidence = tmp_path / "ev"
    p = _sim_run("--key-file", str(proj / "vast.key"), "--workdir", str(proj), "--artifact", "vast.key",
                 "--remote-env", f"OUT={host}", "--evidence-dir", str(evidence), "--", "sh", "-c", COPY_HOST,
                 cwd=tmp_path)
    assert p.returncode == ExitCode.FAILED, p.stderr[-3000:]  # the artifact glob matched nothing on the host
    assert ACCOUNT_KEY.encode() not in _host_bytes(host)
    assert (host / "vh" / "work" / "train.py").is_file()
    assert "left out of the upload: vast.key (the API key file (--key-file))" in _said(p)
    record = _record(evidence)
    assert {"path": "vast.key", "why": "the API key file (--key-file)", "includable": False} in \
        record["workdir"]["left_out"]
    assert record["artifacts"]["unmatched"] == ["vast.key"]
    assert not list(evidence.rglob("artifacts/vast.key"))


def test_the_official_cli_key_file_and_the_harness_dirs_stay_home_when_the_workdir_is_home(tmp_path):
    """The workdir is $HOME, the key comes from the official CLI's ~/.config/vastai/vast_api_key: neither it nor
    the harness's own config and state directories go up, each named."""
    home = tmp_path / "home"
    official = _private(home / "config" / "vastai" / "vast_api_key", ACCOUNT_KEY)
    _private(home / "config" / "vast-harness" / "config.toml", "max_minutes = 20\n")
    (home / "project.py").write_text("print(1)\n")
    host = tmp_path / "host"
    p = _sim_run("--workdir", str(home), "--remote-env", f"OUT={host}", "--", "sh", "-c", COPY_HOST, home=home)
    assert p.returncode == 0, p.stderr[-3000:]
    assert ACCOUNT_KEY.encode() not in _host_bytes(host)
    assert (host / "vh" / "work" / "project.py").is_file() and not (host / "vh" / "work" / "config").exists()
    record = _record(home / "state" / "sim")  # --sim keeps its state and evidence apart from a real run's
    left = {item["path"]: item for item in record["workdir"]["left_out"]}
    assert left["config/vastai/vast_api_key"]["why"] == "the official CLI's API key file"
    assert left["config/vast-harness/"]["why"] == "the harness's config directory"
    assert left["state/"]["why"] == "the harness's state directory"
    assert not any(item["includable"] for item in left.values())
    for name in ("config/vastai/vast_api_key", "config/vast-harness/", "state/"):
        assert f"{name} (" in _said(p), name
    assert official.exists()


def test_include_never_takes_in_the_key_file_and_must_match_a_left_out_file(sim: SimServer, tmp_path):
    proj = _credential_workdir(tmp_path / "proj")
    _private(proj / "vast.key", ACCOUNT_KEY)
    base = ("--key-file", str(proj / "vast.key"), "--workdir", str(proj), "--dry-run")
    refused = _run(*base, "--include", "vast.key", "--", "true", sim=sim, cwd=tmp_path)
    assert refused.returncode == 2
    assert "--include vast.key: vast.key in" in _said(refused)
    assert "is the API key file (--key-file); it is never uploaded" in _said(refused)
    unused = _run(*base, "--include", "train.py", "--", "true", sim=sim, cwd=tmp_path)
    assert unused.returncode == 2 and "--include 'train.py' matches no file left out" in _said(unused)


# ----------------------------------------------------------------------------------------- credential files


def test_credential_files_are_left_out_by_family_and_named_in_the_dry_run(sim: SimServer, tmp_path):
    proj = _credential_workdir(tmp_path / "proj")
    sel = select_workdir(proj)
    assert {item.path: item.why for item in sel.left_out} == CREDENTIALS
    assert all(item.includable for item in sel.left_out)
    assert sorted(f.rel for f in sel.files) == sorted(KEPT)
    p = _run("--workdir", str(proj), "--dry-run", "--", "python", "train.py", sim=sim, cwd=tmp_path,
             key="0123456789abcdef")
    assert p.returncode == 0, p.stderr
    shown = _said(p)
    for rel, why in CREDENTIALS.items():
        assert f"{rel} ({why}" in shown, (rel, shown)
    assert "--include PATH" in shown
    js = _run("--workdir", str(proj), "--dry-run", "--json", "--", "true", sim=sim, cwd=tmp_path,
              key="0123456789abcdef")
    left = json.loads(js.stdout)["workdir"]["left_out"]
    assert {item["path"] for item in left} == set(CREDENTIALS)


@pytest.mark.parametrize(("rel", "family"), [
    (".env", "dotenv file"), ("deploy/prod.env", "dotenv file"), ("a/.env.local", "dotenv file"),
    (".env.example", None), (".env/lib/python3.12/site.py", None),  # a virtualenv called .env is not a dotenv file
    ("home/.ssh/id_ed25519", "SSH private key"), ("home/.ssh/id_ed25519.pub", None),
    ("x/.config/gcloud/credentials.db", "cloud credentials"), ("gcloud/credentials.db", None),
    ("x/.aws/credentials", "cloud credentials"), ("x/.aws/config", None), ("aws/credentials", None),
    ("x/.kube/config", "kube config"), ("prod.kubeconfig", "kube config"), ("src/config.py", None),
    (".cache/huggingface/token", "Hugging Face token"), ("token", None), ("tls/site.key", "TLS private key"),
])
def test_a_credential_is_known_by_its_name_its_path_end_or_its_folder(rel, family):
    from vast_harness.spec.credentials import credential_family

    assert credential_family(rel) == family


def test_credential_files_stay_home_in_a_run_and_include_takes_one_in(sim: SimServer, tmp_path):
    """A real run: no credential's bytes on the host but the one taken in with --include; the console and the
    record name every one left out."""
    proj = _credential_workdir(tmp_path / "proj")
    host = tmp_path / "host"
    evidence = tmp_path / "ev"
    p = cli("run", "--sim", "--workdir", str(proj), "--include", ".netrc", "--remote-env", f"OUT={host}",
            "--remote-env", "HF_TOKEN=hf_x", "--evidence-dir", str(evidence), "--", "sh", "-c", COPY_HOST,
            cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    on_host = _host_bytes(host)
    for rel in CREDENTIALS:
        assert (_secret(rel).encode() in on_host) == (rel == ".netrc"), rel
    for rel in KEPT:
        assert (host / "vh" / "work" / rel).is_file(), rel
    record = _record(evidence)
    assert {item["path"] for item in record["workdir"]["left_out"]} == set(CREDENTIALS) - {".netrc"}
    assert record["workdir"]["included"] == [".netrc"]
    for rel in set(CREDENTIALS) - {".netrc"}:
        assert f"{rel} ({CREDENTIALS[rel]}" in _said(p), rel
    assert "--remote-env HF_TOKEN looks like a secret: pass it as --remote-secret HF_TOKEN" in _said(p)


def test_a_profile_workdir_takes_credentials_in_with_its_include_field(tmp_path):
    from vast_harness.spec.profile import load_profile

    smoke = (ROOT / "profiles" / "harness" / "smoke.toml").read_text()
    image = next(line for line in smoke.splitlines() if line.startswith("image ="))
    _credential_workdir(tmp_path / "proj")
    (tmp_path / "mine.toml").write_text(
        f'name = "mine"\n{image}\nimage_cuda = 12.8\n[caps]\nmax_usd = 1\nmax_minutes = 20\n'
        '[workdir]\npath = "proj"\ninclude = [".npmrc"]\n[[steps]]\nname = "t"\nrun = "true"\n')
    prof = load_profile(str(tmp_path / "mine.toml"))
    assert prof.workdir is not None and prof.workdir.include == [".npmrc"]
    sel = select_workdir(Path(prof.workdir.path), include=prof.workdir.include)
    assert ".npmrc" in [f.rel for f in sel.files] and sel.included == [".npmrc"]
    (tmp_path / "empty.toml").write_text((tmp_path / "mine.toml").read_text().replace('path = "proj"', 'path = ""'))
    with pytest.raises(ConfigError, match="the workdir path is empty"):
        load_profile(str(tmp_path / "empty.toml"))


# ----------------------------------------------------------------------------------------- settings and secrets


@pytest.mark.parametrize("name", ["GITHUB_TOKEN", "WANDB_API_KEY", "AWS_SECRET", "PASSWORD", "db_password"])
def test_a_token_like_remote_env_name_gets_a_hint_to_use_remote_secret(name, sim: SimServer, tmp_path):
    p = _run("--workdir", str(EXAMPLE), "--dry-run", "--remote-env", f"{name}=x", "--remote-env", "EPOCHS=2",
            "--", "true", sim=sim, cwd=tmp_path, key="0123456789abcdef")
    assert p.returncode == 0, p.stderr
    said = _said(p)
    assert f"--remote-env {name} looks like a secret: pass it as --remote-secret {name}" in said
    assert "--remote-env EPOCHS" not in said


def test_an_empty_secret_is_bad_input(sim: SimServer, tmp_path):
    base = ("--workdir", str(EXAMPLE), "--dry-run")
    given = _run(*base, "--remote-secret", "K=", "--", "true", sim=sim, cwd=tmp_path, key="0123456789abcdef")
    assert given.returncode == 2 and "--remote-secret K: the value is empty" in _said(given)
    from_env = _run(*base, "--remote-secret", "K", "--", "true", sim=sim, cwd=tmp_path, key="0123456789abcdef",
                   env={"K": ""})
    assert from_env.returncode == 2 and "--remote-secret K: the value is empty" in _said(from_env)
    secrets = _private(tmp_path / "secrets", "A=1\nK=\n")
    from_file = _run(*base, "--remote-secret-file", str(secrets), "--", "true", sim=sim, cwd=tmp_path,
                    key="0123456789abcdef")
    assert from_file.returncode == 2 and "K: the value is empty" in _said(from_file)
    assert _run(*base, "--remote-env", "K=", "--", "true", sim=sim, cwd=tmp_path,
               key="0123456789abcdef").returncode == 0  # a setting may be empty


def test_an_empty_workdir_is_bad_input_not_the_current_directory(sim: SimServer, tmp_path):
    from vast_harness import api

    (tmp_path / ".env").write_text("SECRET=1\n")
    p = _run("--workdir", "", "--dry-run", "--", "true", sim=sim, cwd=tmp_path, key="0123456789abcdef")
    assert p.returncode == 2 and "--workdir is empty" in _said(p)
    with pytest.raises(ConfigError, match="workdir is empty"):
        api.run_workload(["true"], workdir="", sim=True, dry_run=True)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"max_usd": "abc"}, "max_usd"), ({"max_usd": True}, "max_usd"), ({"num_gpus": 1.7}, "num_gpus"),
    ({"max_minutes": "ten"}, "max_minutes"), ({"num_gpus": True}, "num_gpus"), ({"boot_retries": 0.5}, "boot_retries"),
    ({"workdir_max_mb": "big"}, "workdir_max_mb"), ({"min_gpu_ram_gb": [1]}, "min_gpu_ram_gb"),
    ({"dry_run": "yes"}, "dry_run"), ({"key_file": 3}, "key_file"),
], ids=lambda v: repr(v) if not isinstance(v, str) else v)
def test_run_workload_refuses_a_wrong_type_as_config_error_naming_the_argument(kwargs, field, sim: SimServer,
                                                                              monkeypatch):
    from vast_harness import api

    monkeypatch.setenv("VAST_API_KEY", "0123456789abcdef")
    calls_before = len(sim.state()["calls"])
    with pytest.raises(ConfigError, match=f"run_workload: {field} ") as refused:
        api.run_workload(["true"], workdir=EXAMPLE, api_url=sim.url, **kwargs)
    assert refused.value.exit_code == 2
    assert sim.state()["calls"][calls_before:] == []


def test_a_hard_link_to_the_key_file_stays_home_too(tmp_path):
    """The key file is left out by what it is (device and inode), not by its spelling: a second path to it
    (a hard link) stays home too."""
    from vast_harness.spec.workdir import NeverUpload

    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "a.py").write_text("1\n")
    key = _private(tmp_path / "outside.key", ACCOUNT_KEY)
    os.link(key, proj / "renamed.txt")
    assert stat.S_IMODE((proj / "renamed.txt").stat().st_mode) == 0o600
    sel = select_workdir(proj, never_upload=[NeverUpload(path=key, why="the API key file (--key-file)")])
    assert [f.rel for f in sel.files] == ["a.py"]
    assert [(i.path, i.why) for i in sel.left_out] == [("renamed.txt", "the API key file (--key-file)")]


# ----------------------------------------------------------------------------------------- the harness's own dirs


@pytest.mark.parametrize(("where", "why"), [
    ("state", "the harness's state directory"),
    ("state/20261206T095811Z-cad931/artifacts", "the harness's state directory"),
    ("ev", "the harness's evidence directory"),
    ("config/vast-harness", "the harness's config directory"),
])
def test_a_workdir_that_is_or_is_inside_a_harness_dir_is_refused_before_renting(where, why, sim: SimServer,
                                                                                tmp_path):
    """Issue 43 F1: the state dir holds the ledger, the registrations and earlier runs' artifacts (a key among
    them); a workdir that IS it, or lies inside it, is exit 2 naming the directory, nothing rented."""
    home = tmp_path / "home"
    workdir = home / where
    _private(workdir / "out" / "key.bin", ACCOUNT_KEY)
    (workdir / "a.py").write_text("1\n")
    calls_before = len(sim.state()["calls"])
    for dry in ((), ("--dry-run",)):
        p = _run("--workdir", str(workdir), "--evidence-dir", str(home / "ev"), *dry, "--", "true",
                 home=home, sim=sim, key=ACCOUNT_KEY)
        said = _said(p)
        assert p.returncode == 2, said[-3000:]
        owner = home / where.split("/")[0] if where != "config/vast-harness" else workdir
        assert f"--workdir {workdir.resolve()}: " in said and str(owner) in said and why in said, said
    assert sim.state()["calls"][calls_before:] == []


def test_a_sim_workdir_inside_the_state_dir_is_refused(tmp_path):
    """With --sim the run's state is <state>/sim: that, and the user's state dir above it, are refused too."""
    home = tmp_path / "home"
    for where in (home / "state" / "sim", home / "state"):
        (where / "x").mkdir(parents=True, exist_ok=True)
        (where / "x" / "a.py").write_text("1\n")
        p = cli("run", "--sim", "--workdir", str(where / "x"), "--", "true", home=home)
        assert p.returncode == 2 and "the harness's state directory" in _said(p), _said(p)[-2000:]


# ----------------------------------------------------------------------------------------- a copy of the key

HOLDS_KEY = "holds the account's API key"


def _key_copies(proj: Path) -> Path:
    (proj / "train.py").parent.mkdir(parents=True, exist_ok=True)
    (proj / "train.py").write_text("print('trained')\n")
    (proj / "copy_of_key.txt").write_text(ACCOUNT_KEY + "\n")  # 0644, another name: only its bytes tell
    (proj / "notes.md").write_text("# notes\nmy key: " + ACCOUNT_KEY + " (do not share)\n")
    _private(proj / "sub" / "deep" / ".hidden" / "vast_api_key", ACCOUNT_KEY)  # a credential by name as well
    return proj


def test_a_copy_of_the_account_key_under_any_name_stays_home_and_is_named(tmp_path):
    """Issue 43 F2: a file whose bytes hold the account key is left out whatever its name, named in the
    console and the record, and not offered to --include."""
    proj = _key_copies(tmp_path / "proj")
    key = _private(tmp_path / "vast.key", ACCOUNT_KEY + "\n")
    host, evidence = tmp_path / "host", tmp_path / "ev"
    p = _sim_run("--key-file", str(key), "--workdir", str(proj), "--remote-env", f"OUT={host}",
                 "--evidence-dir", str(evidence), "--", "sh", "-c", COPY_HOST, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert ACCOUNT_KEY.encode() not in _host_bytes(host)
    assert (host / "vh" / "work" / "train.py").is_file()
    left = {item["path"]: item for item in _record(evidence)["workdir"]["left_out"]}
    for rel in ("copy_of_key.txt", "notes.md", "sub/deep/.hidden/vast_api_key"):
        assert left[rel] == {"path": rel, "why": HOLDS_KEY, "includable": False}, left
        assert f"{rel} ({HOLDS_KEY})" in _said(p)


def test_include_cannot_take_in_a_copy_of_the_account_key(sim: SimServer, tmp_path):
    proj = _key_copies(tmp_path / "proj")
    key = _private(tmp_path / "vast.key", ACCOUNT_KEY)
    base = ("--key-file", str(key), "--workdir", str(proj))
    dry = _run(*base, "--dry-run", "--", "true", sim=sim, cwd=tmp_path)
    assert dry.returncode == 0, _said(dry)[-3000:]
    assert f"sub/deep/.hidden/vast_api_key ({HOLDS_KEY})" in _said(dry)
    assert f"copy_of_key.txt ({HOLDS_KEY})" in _said(dry)
    calls_before = len(sim.state()["calls"])
    for glob in ("sub/deep/.hidden/vast_api_key", "**/vast_api_key"):
        refused = _run(*base, "--include", glob, "--", "true", sim=sim, cwd=tmp_path)
        assert refused.returncode == 2, _said(refused)[-3000:]
        assert f"--include {glob}: sub/deep/.hidden/vast_api_key in" in _said(refused)
        assert HOLDS_KEY in _said(refused)
    assert sim.state()["calls"][calls_before:] == []


def test_with_sim_a_copy_of_the_key_the_run_was_given_stays_home(tmp_path):
    """--sim reads no real key, but the key file it was given is known: a copy of it stays home too."""
    proj = _key_copies(tmp_path / "proj")
    key = _private(tmp_path / "vast.key", ACCOUNT_KEY)
    (tmp_path / "home").mkdir()
    p = cli("run", "--sim", "--key-file", str(key), "--workdir", str(proj), "--dry-run", "--", "true",
            home=tmp_path / "home")
    assert p.returncode == 0, _said(p)[-3000:]
    assert f"copy_of_key.txt ({HOLDS_KEY})" in _said(p)


def test_the_official_cli_key_file_is_never_uploaded_from_either_config_home():
    """The official CLI reads its key from xdg_config_home() when the `xdg` package imports, else from
    ~/.config (vast.py APIKEY_FILE): both are listed whatever XDG_CONFIG_HOME says."""
    from vast_harness.spec.resolve import never_upload

    never = never_upload(key_file=None, config_key_file=None, environ={"HOME": "/h", "XDG_CONFIG_HOME": "/x"},
                         dirs=[])
    paths = {str(item.path) for item in never if item.why == "the official CLI's API key file"}
    assert {"/x/vastai/vast_api_key", "/h/.config/vastai/vast_api_key", "/h/.vast_api_key"} <= paths


# ----------------------------------------------------------------------------------------- credential variants


@pytest.mark.parametrize(("rel", "family"), [
    (".ENV", "dotenv file"), (".Env.local", "dotenv file"), (".SSH/ID_RSA", "SSH private key"),
    ("Id_Ed25519", "SSH private key"), ("server.KEY", "TLS private key"), ("sub/.AWS/Credentials", "cloud credentials"),
    ("sub/.NETRC", "netrc"), (".env\u200b", "dotenv file"), ("\uff0eenv", "dotenv file"), (".env ", "dotenv file"),
    (".e\u00adnv", "dotenv file"), (".ENV.EXAMPLE", None), ("Id_Ed25519.PUB", None),
], ids=ascii)
def test_a_credential_name_is_matched_whatever_its_case_width_or_invisible_characters(rel, family):
    """Issue 43 F7: on macOS's case-insensitive disk `.ENV` is the very file the rule names; a zero-width space,
    a fullwidth dot or a trailing space only hide a name from an exact match."""
    from vast_harness.spec.credentials import credential_family

    assert credential_family(rel) == family


SA = {"type": "service_account", "project_id": "p", "private_key_id": "1",
      "private_key": "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"}


PRIVATE_KEY_CONTENTS = [
    ("bom_notes.txt", b"\xef\xbb\xbf-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----\n"),
    ("pgp.asc", b"-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBF\n-----END PGP PRIVATE KEY BLOCK-----\n"),
    ("sa_bom.json", b"\xef\xbb\xbf" + json.dumps(SA).encode()),
    ("sa_escaped.json", json.dumps(SA).replace("service_account", "service\\u005faccount").encode()),
]


@pytest.mark.parametrize(("name", "body"), PRIVATE_KEY_CONTENTS)
def test_a_private_key_is_known_by_its_content_behind_a_bom_an_escape_or_pgp_armour(name, body, tmp_path):
    from vast_harness.spec.credentials import credential_content

    (tmp_path / "a.py").write_text("1\n")
    (tmp_path / name).write_bytes(body)
    assert credential_content(tmp_path / name) is not None
    assert [f.rel for f in select_workdir(tmp_path).files] == ["a.py"]


def test_a_git_folder_in_any_case_is_never_uploaded(tmp_path):
    """`.GIT/config` holding a remote URL with a token: on a case-insensitive disk that is git's own folder."""
    (tmp_path / "a.py").write_text("1\n")
    for git in (".git", ".GIT", "vendor/.Git"):
        (tmp_path / git).mkdir(parents=True)
        (tmp_path / git / "config").write_text("[remote]\nurl = https://x:ghp_token@github.com/a/b\n")
    assert [f.rel for f in select_workdir(tmp_path).files] == ["a.py"]


# ----------------------------------------------------------------------------------------- the key in a name, UTF-16

KEY_IN_NAME = "its name holds the account's API key"
FULLWIDTH_KEY = "".join(chr(ord(c) + 0xFEE0) for c in ACCOUNT_KEY)  # NFKC makes it the key: the masker reads it so


def _key_named(proj: Path) -> Path:
    (proj / "train.py").parent.mkdir(parents=True, exist_ok=True)
    (proj / "train.py").write_text("print('trained')\n")
    (proj / f"name-{ACCOUNT_KEY}").write_text("nothing secret inside\n")
    (proj / f"dir-{ACCOUNT_KEY}" / "sub").mkdir(parents=True)
    (proj / f"dir-{ACCOUNT_KEY}" / "sub" / "a.py").write_text("1\n")
    (proj / f"wide-{FULLWIDTH_KEY}.txt").write_text("nothing secret inside\n")
    (proj / f"hidden-{ACCOUNT_KEY[:20]}\u200b{ACCOUNT_KEY[20:]}").write_text("x\n")  # a zero-width space inside
    return proj


def test_a_file_or_folder_whose_name_holds_the_account_key_stays_home_named_masked(sim: SimServer, tmp_path):
    """Red team r45 #5: a name is uploaded as it is, so one that holds the key (in any form the masker reads it
    in) is left out like a copy of the key, named with the key masked, and --include cannot take it in."""
    proj = _key_named(tmp_path / "proj")
    sel = select_workdir(proj, account_keys=[ACCOUNT_KEY])
    assert [f.rel for f in sel.files] == ["train.py"]
    left = {item.path: item for item in sel.left_out}
    assert set(left) == {"name-***", "dir-***/", "wide-***.txt", "hidden-***"}, left
    assert all(item.why == KEY_IN_NAME and not item.includable for item in left.values())
    key = _private(tmp_path / "vast.key", ACCOUNT_KEY)
    dry = _run("--key-file", str(key), "--workdir", str(proj), "--dry-run", "--json", "--", "true", sim=sim,
               cwd=tmp_path)
    assert dry.returncode == 0, _said(dry)[-3000:]
    assert ACCOUNT_KEY not in dry.stdout + dry.stderr and FULLWIDTH_KEY not in dry.stdout + dry.stderr
    shown = {i["path"]: i["why"] for i in json.loads(dry.stdout)["workdir"]["left_out"]}
    assert shown == dict.fromkeys(("dir-***/", "hidden-***", "name-***", "wide-***.txt"), KEY_IN_NAME)
    refused = _run("--key-file", str(key), "--workdir", str(proj), "--include", "name-*", "--dry-run", "--", "true",
                   sim=sim, cwd=tmp_path)
    assert refused.returncode == 2 and "--include name-*: name-*** in" in _said(refused), _said(refused)[-2000:]
    assert ACCOUNT_KEY not in refused.stdout + refused.stderr


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"])
def test_a_copy_of_the_key_in_utf16_or_utf32_stays_home_like_a_utf8_one(codec, tmp_path):
    """Red team r45 #5: `utf-16`/`utf-32` write a BOM, the -le/-be codecs none; a key far into a big file (past
    the scan's first chunk, across its boundary) is found as in UTF-8."""
    from vast_harness.host.bundle import build_workdir_bundle
    from vast_harness.spec.workdir import file_holds_key, key_needles

    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("print('trained')\n")
    (proj / "k.txt").write_bytes(f"my key: {ACCOUNT_KEY}\n".encode(codec))
    (proj / "ascii.txt").write_bytes("no key here, only text\n".encode(codec))  # wide text is not, by itself, a key
    sel = select_workdir(proj, account_keys=[ACCOUNT_KEY])
    bundle = build_workdir_bundle(sel, [ACCOUNT_KEY])
    assert bundle.workdir is not None
    assert [(i.path, i.why) for i in bundle.workdir.left_out] == [("k.txt", HOLDS_KEY)]
    assert bundle.files == 2
    big = tmp_path / "big.bin"
    text = f"{'x' * ((1 << 20) // len('x'.encode(codec)) - 7)}{ACCOUNT_KEY}"  # cut by the 1 MiB chunk boundary
    big.write_bytes(b"\0" * (3 << 20) + text.encode(codec))
    assert file_holds_key(big, key_needles([ACCOUNT_KEY]))
    assert not file_holds_key(proj / "ascii.txt", key_needles([ACCOUNT_KEY]))


# ----------------------------------------------------------------------------------------- more credential families

AWS_ID, AWS_SECRET = "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"  # AWS's documented example


def _aws(*lines: str) -> bytes:
    return "\n".join(lines).encode() + b"\n"


@pytest.mark.parametrize(("rel", "family"), [
    (".vault-token", "Vault token"), ("home/.vault-token", "Vault token"), (".VAULT-TOKEN", "Vault token"),
    ("vault-token.md", None),
    (".huggingface/token", "Hugging Face token"), ("home/.huggingface/token", "Hugging Face token"),
    (".cache/huggingface/stored_tokens", "Hugging Face token"), ("huggingface/tokenizer.json", None),
])
def test_a_vault_token_and_the_old_hugging_face_token_are_credentials_by_name(rel, family):
    """Red team r45 #6: `~/.vault-token` and `~/.huggingface/token` (huggingface_hub's place before ~/.cache)."""
    from vast_harness.spec.credentials import credential_family

    assert credential_family(rel) == family


AWS_SETTINGS = [
    ("aws.ini", _aws("[default]", f"aws_access_key_id = {AWS_ID}", f"aws_secret_access_key = {AWS_SECRET}"), True),
    ("prod.cfg", _aws("[p]", "region=us-east-1", f"AWS_SECRET_ACCESS_KEY={AWS_SECRET[:30]}"), True),
    ("vars.sh", _aws("#!/bin/sh", f"export AWS_ACCESS_KEY_ID={AWS_ID}", f'export AWS_SECRET_ACCESS_KEY="{AWS_SECRET}"'),
     True),
    ("s3.yaml", _aws("s3:", f"  aws_access_key_id: {AWS_ID}", f"  aws_secret_access_key: '{AWS_SECRET}'"), True),
    ("creds.json", _aws("{", f'  "aws_access_key_id": "{AWS_ID}",', f'  "aws_secret_access_key": "{AWS_SECRET}",',
                        '  "region": "x"', "}"), True),
    ("session.env.txt", _aws("[s]", "aws_session_token = FwoGZXIvYXdzEJr//////////wEaDEXAMPLE"), True),
    ("user_accessKeys.csv", _aws("Access key ID,Secret access key", f"{AWS_ID},{AWS_SECRET}"), True),
    ("notes.md", _aws("# keys", f"id {AWS_ID}", f"secret {AWS_SECRET}"), True),
    ("upload.py", _aws("import boto3", "s3 = boto3.client(", "    aws_access_key_id=key_id,",
                       "    aws_secret_access_key=os.environ['AWS_SECRET_ACCESS_KEY'],", ")"), False),
    ("template.ini", _aws("[default]", "aws_access_key_id = ${AWS_ACCESS_KEY_ID}",
                          "aws_secret_access_key = ${AWS_SECRET_ACCESS_KEY}"), False),
    ("id_only.ini", _aws("[default]", f"aws_access_key_id = {AWS_ID}"), False),  # an id alone is not a secret
    ("shas.txt", _aws(f"{AWS_ID} 2fd4e1c67a2d28fced849ee1bb76e7391b93eb12"), False),  # a hex digest is no secret
]


@pytest.mark.parametrize(("name", "body", "caught"), AWS_SETTINGS)
def test_aws_keys_are_known_by_their_content_like_a_service_account_key(name, body, caught, tmp_path):
    """Red team r45 #6: an ini, env, YAML or JSON file that sets an AWS secret access key (or a session token), or
    an AKIA/ASIA key id with a secret beside it (the console's CSV), is a credential whatever its name."""
    from vast_harness.spec.credentials import credential_content

    (tmp_path / "a.py").write_text("1\n")
    (tmp_path / name).write_bytes(body)
    assert credential_content(tmp_path / name) == ("cloud credentials (by its content)" if caught else None)
    sel = select_workdir(tmp_path)
    assert sorted(f.rel for f in sel.files) == sorted(["a.py"] + ([] if caught else [name]))
    assert [i.includable for i in sel.left_out] == ([True] if caught else [])


AWS_TOKEN = "FwoGZXIvYXdzEJr//////////wEaDEXAMPLE+token/2Q=="
_STS = {"Credentials": {"AccessKeyId": "ASIAEXAMPLE", "SecretAccessKey": AWS_SECRET, "SessionToken": AWS_TOKEN,
                        "Expiration": "2026-01-01T00:00:00+00:00"},
        "AssumedRoleUser": {"AssumedRoleId": "AROAEXAMPLE:s", "Arn": "arn:aws:sts::123456789012:assumed-role/r/s"}}


AWS_DOCUMENTS = [
    ("j1.json", json.dumps({"aws_secret_access_key": AWS_SECRET}).encode(), True),  # as json.dump writes it
    ("j4.json", json.dumps({"aws_session_token": AWS_TOKEN}).encode(), True),
    ("many.json", json.dumps({"region": "us-east-1", "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
                              "Aws_Session_Token": AWS_TOKEN}).encode(), True),
    ("nested.json", json.dumps({"profiles": {"p": {"aws_secret_access_key": AWS_SECRET}}}).encode(), True),
    ("sts.json", json.dumps(_STS).encode(), True),  # `aws sts assume-role` output, any layout
    ("sts-cli.json", json.dumps(_STS, indent=4).encode(), True),
    ("sts.yaml", _aws("Credentials:", "  AccessKeyId: ASIAEXAMPLE", f"  SecretAccessKey: {AWS_SECRET}",
                      f"  SessionToken: {AWS_TOKEN}"), True),
    ("one.py", _aws(f's3 = boto3.client("s3", aws_access_key_id="x", aws_secret_access_key="{AWS_SECRET}")'), True),
    ("s3.js", _aws(f'new S3Client({{credentials: {{accessKeyId: "AKIAEXAMPLE", secretAccessKey: "{AWS_SECRET}"}}}})'),
     True),
    ("ref.json", json.dumps({"aws_secret_access_key": "${AWS_SECRET_ACCESS_KEY}",
                             "aws_session_token": "$AWS_SESSION_TOKEN"}).encode(), False),
    ("empty.json", json.dumps({"aws_secret_access_key": "", "aws_session_token": None}).encode(), False),
    ("placeholder.json", json.dumps({"aws_secret_access_key": "<YOUR_SECRET_ACCESS_KEY>"}).encode(), False),
    ("placeholder-pretty.json", json.dumps({"aws_secret_access_key": "<YOUR_SECRET_ACCESS_KEY>"}, indent=2).encode(),
     False),
    ("schema.json", json.dumps({"properties": {"aws_secret_access_key": {"type": "string"}}}).encode(), False),
    ("env.py", _aws('s3 = boto3.client("s3", aws_secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"])'), False),
    ("typed.py", _aws('def client(aws_secret_access_key: "Optional[str]" = None): ...'), False),
    ("cfn.yaml", _aws("Outputs:", "  Secret:", "    Value: !GetAtt Key.SecretAccessKey",
                      "  SecretAccessKey: !GetAtt Key.SecretAccessKey"), False),
    ("web.json", json.dumps({"user": "ann", "sessionToken": "r:0123456789abcdef"}).encode(), False),  # not AWS's
]


@pytest.mark.parametrize(("name", "body", "caught"), AWS_DOCUMENTS)
def test_aws_keys_set_in_one_line_json_or_an_sts_document_are_left_out(name, body, caught, tmp_path):
    """Red team r46 F4: compact JSON (`json.dump`'s one line) setting `aws_secret_access_key` or
    `aws_session_token`, any number of them on a line, and `aws sts assume-role` output (`SecretAccessKey`,
    `SessionToken`) in any layout, are credentials like the pretty-printed form; a reference, an empty value, a
    placeholder, a schema or a `sessionToken` with no AWS access key id beside it is not."""
    from vast_harness.spec.credentials import credential_content

    (tmp_path / "a.py").write_text("1\n")
    (tmp_path / name).write_bytes(body)
    assert credential_content(tmp_path / name) == ("cloud credentials (by its content)" if caught else None)
    sel = select_workdir(tmp_path)
    assert sorted(f.rel for f in sel.files) == sorted(["a.py"] + ([] if caught else [name]))
    assert [(i.path, i.includable) for i in sel.left_out] == ([(name, True)] if caught else [])


CONTENT_CAUGHT = [(name, body) for name, body in PRIVATE_KEY_CONTENTS] + \
    [(name, body) for name, body, caught in AWS_SETTINGS + AWS_DOCUMENTS if caught]
CONTENT_PASSED = [(name, body) for name, body, caught in AWS_SETTINGS + AWS_DOCUMENTS if not caught]
WIDE_BOMS = {"utf-16-le": codecs.BOM_UTF16_LE, "utf-16-be": codecs.BOM_UTF16_BE,
             "utf-32-le": codecs.BOM_UTF32_LE, "utf-32-be": codecs.BOM_UTF32_BE}


def _wide(body: bytes, codec: str) -> bytes:
    """The text as PowerShell 5's `>` (UTF-16LE) or another Unicode writer saves it: a BOM, then the text."""
    return WIDE_BOMS[codec] + body.decode("utf-8-sig").encode(codec)


@pytest.mark.parametrize("codec", list(WIDE_BOMS))
@pytest.mark.parametrize(("name", "body"), CONTENT_CAUGHT, ids=[n for n, _ in CONTENT_CAUGHT])
def test_a_credential_known_by_its_content_is_known_in_utf16_or_utf32_with_a_bom(name, body, codec, tmp_path):
    """Red team r47 F6: a service-account key or an STS document saved as UTF-16 with a BOM (PowerShell 5's
    `>`) was uploaded, unnamed; every content rule reads the text after a UTF-16 or UTF-32 BOM as after UTF-8's."""
    from vast_harness.spec.credentials import credential_content

    (tmp_path / "a.py").write_text("1\n")
    (tmp_path / name).write_bytes(_wide(body, codec))
    assert credential_content(tmp_path / name) is not None
    sel = select_workdir(tmp_path)
    assert [f.rel for f in sel.files] == ["a.py"]
    assert [(i.path, i.includable) for i in sel.left_out] == [(name, True)]


@pytest.mark.parametrize(("name", "body"), CONTENT_PASSED, ids=[n for n, _ in CONTENT_PASSED])
def test_a_file_no_content_rule_catches_in_utf8_is_uploaded_in_utf16_too(name, body, tmp_path):
    """Decoding wide text does not make a reference, a placeholder or a schema a credential."""
    from vast_harness.spec.credentials import credential_content

    (tmp_path / name).write_bytes(_wide(body, "utf-16-le"))
    assert credential_content(tmp_path / name) is None
    assert [f.rel for f in select_workdir(tmp_path).files] == [name]


def test_a_private_key_after_a_long_certificate_chain_in_utf16_is_found(tmp_path):
    """The scan reads the first 64 kB of the file whatever its encoding: a key past the first 4 kB of the
    file (where the wide text is decoded from) is found."""
    from vast_harness.spec.credentials import credential_content

    chain = "-----BEGIN CERTIFICATE-----\n" + "MIIC" * 2000 + "\n-----END CERTIFICATE-----\n"
    key = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"
    (tmp_path / "bundle.pem").write_bytes(_wide((chain + key).encode(), "utf-16-le"))
    assert credential_content(tmp_path / "bundle.pem") == "private key (by its content)"


# ----------------------------------------------------------------------------------------- a walk that cannot read

DEEP_NAME = "d" * 200


def _deep_workdir(wd: Path, depth: int = 25) -> Path:
    """`wd/top/` and `depth` nested folders of 200 characters each: every name is valid, the full path is
    longer than PATH_MAX (built with dir_fd, as only that can)."""
    (wd / "top").mkdir(parents=True)
    (wd / "a.py").write_text("print(1)\n")
    fd = os.open(wd / "top", os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir(DEEP_NAME, dir_fd=fd)
            deeper = os.open(DEEP_NAME, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = deeper
    finally:
        os.close(fd)
    return wd


def test_a_workdir_path_longer_than_path_max_is_bad_input_naming_it(sim: SimServer, tmp_path):
    """Red team r46 F5: a tree deeper than PATH_MAX was a traceback from `Path.is_symlink()` and exit 1, for
    `run`, `run --dry-run` and `up`. It is bad input: exit 2 before anything is rented, naming the path
    (shortened) and why, with the flag that leaves it out."""
    from vast_harness.state.held import HeldStore

    home = tmp_path / "home"
    home.mkdir()
    wd = _deep_workdir(tmp_path / "wd")
    calls_before = len(sim.state()["calls"])
    runs = {
        "run": _run("--workdir", str(wd), "--max-minutes", "5", "--", "python", "a.py", sim=sim, home=home,
                    key=ACCOUNT_KEY),
        "run --dry-run": _run("--workdir", str(wd), "--dry-run", "--", "python", "a.py", sim=sim, home=home,
                              key=ACCOUNT_KEY),
        "up": cli("up", "deep", "--workdir", str(wd), "--max-minutes", "4", sim=sim, home=home, key=ACCOUNT_KEY),
        "run --sim": cli("run", "--sim", "--workdir", str(wd), "--max-minutes", "5", "--", "python", "a.py",
                         home=home),
        "up --sim": cli("up", "deep-sim", "--sim", "--workdir", str(wd), home=home),
    }
    for what, p in runs.items():
        said = _said(p)
        assert p.returncode == ExitCode.BAD_INPUT, (what, said[-3000:])
        assert "Traceback" not in p.stderr, (what, p.stderr[-3000:])
        assert f"--workdir {wd.resolve()}: cannot read top/dddddddddddd…dddddddd/" in said, (what, said)
        assert re.search(r"its path is [\d,]+ bytes, over the system's limit of [\d,]+ \(PATH_MAX\); leave it out "
                         r"with \.gitignore or --exclude 'top/'", said), (what, said)
        assert len(said) < 1000, (what, said)  # shortened: not the 5 kB path
    assert sim.state()["calls"][calls_before:] == []
    assert HeldStore(home / "state").load("deep") is None and HeldStore(home / "state" / "sim").load("deep-sim") is None
    hinted = _run("--workdir", str(wd), "--exclude", "top/", "--dry-run", "--", "python", "a.py", sim=sim, home=home,
                  key=ACCOUNT_KEY)
    assert hinted.returncode == 0, _said(hinted)[-3000:]  # what the error says to do is enough


@pytest.mark.parametrize(("parts", "why"), [
    (["x" * 200] * 25, r"its path is [\d,]+ bytes, over the system's limit of [\d,]+ \(PATH_MAX\)"),
    (["x" * 300, "y"], r"a name in it is 300 bytes, over the system's limit of [\d,]+ \(NAME_MAX\)"),
])
def test_a_workdir_argument_too_long_for_the_system_is_bad_input(parts, why, tmp_path):
    with pytest.raises(ConfigError, match=f"--workdir /.*/xxxxxxxxxxxx…xxxxxxxx/.*: cannot read it: {why}$"):
        select_workdir(tmp_path.joinpath(*parts))


def test_a_symlink_loop_in_the_workdir_is_skipped_and_listed_like_any_symlink(tmp_path):
    """ELOOP: a symlink that points at itself (a file's place or a folder's) is never followed, so never read."""
    (tmp_path / "a.py").write_text("1\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "sub" / "ring").symlink_to("../sub/ring")
    sel = select_workdir(tmp_path)
    assert [f.rel for f in sel.files] == ["a.py"] and sel.symlinks == ["loop", "sub/ring"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a folder whatever its mode (the injected test below runs)")
def test_an_unreadable_folder_in_the_workdir_is_bad_input_naming_it(tmp_path):
    (tmp_path / "a.py").write_text("1\n")
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked" / "b.py").write_text("1\n")
    (tmp_path / "locked").chmod(0)
    try:
        with pytest.raises(ConfigError, match=r"cannot read locked: Permission denied; .*--exclude 'locked/'"):
            select_workdir(tmp_path)
    finally:
        (tmp_path / "locked").chmod(0o755)


@pytest.mark.parametrize(("call", "err", "at", "exclude", "outcome"), [
    ("scandir", errno.EACCES, "locked", (), "cannot read locked: Permission denied; .*--exclude 'locked/'"),
    ("scandir", errno.EIO, "locked", (), "cannot read locked: Input/output error"),
    ("scandir", errno.ENOENT, "locked", (), None),  # removed since its parent was listed: nothing of it to upload
    ("lstat", errno.EACCES, "locked/b.py", (), "cannot read locked/b.py: Permission denied; .*--exclude 'locked/b.py'"),
    ("lstat", errno.EACCES, "locked/b.py", ("b.py",), None),  # left out anyway: as the error says to
    ("lstat", errno.ENOENT, "locked/b.py", (), None),  # a file gone between the listing and its stat
    ("lstat", errno.ENOENT, "locked", (), None),
])
def test_an_error_reading_the_workdir_is_bad_input_or_a_file_gone_is_skipped(call, err, at, exclude, outcome,
                                                                              tmp_path, monkeypatch):
    """What the walk meets besides a long path, each from the system call that meets it: a folder it cannot
    list or an entry it cannot stat is bad input naming it (an upload without it would run on other files
    than the user's); one removed since its folder was listed is simply not there to upload."""
    (tmp_path / "a.py").write_text("1\n")
    (tmp_path / "locked").mkdir()
    (tmp_path / "locked" / "b.py").write_text("1\n")
    target = str(tmp_path / at)
    real = getattr(os, call)

    def failing(path, *args, **kwargs):
        if os.fspath(path) == target:
            raise OSError(err, os.strerror(err), os.fspath(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, call, failing)
    if outcome is None:
        assert [f.rel for f in select_workdir(tmp_path, exclude=exclude).files] == ["a.py"]
    else:
        with pytest.raises(ConfigError, match=f"--workdir {tmp_path}: {outcome}"):
            select_workdir(tmp_path, exclude=exclude)
