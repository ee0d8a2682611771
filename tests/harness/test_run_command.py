"""`vast-e2e run -- CMD` and `run_workload`: the user's own workdir and command under every guarantee.

The example (examples/tiny-train) runs end to end through the CLI on the embedded simulator (real HTTP, real
SSH); the Python entry point runs a workdir whose artifacts overflow the pull budget; every bad input exits 2
naming it, with nothing sent to the marketplace and nothing in the ledger. The workdir rules (.gitignore,
--exclude, symlinks, the size limit) and the artifact globs are checked on real folders.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.harness.clirun import cli, cli_process
from vast_harness.cli import app as cli_app
from vast_harness.errors import ConfigError, ExitCode
from vast_harness.host.bundle import build_workdir_bundle
from vast_harness.sim import SimServer
from vast_harness.spec.workdir import ArtifactGlobs, check_glob, select_workdir

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny-train"
SECRET = "tok-SECRET-4be1c9d07a"  # distinctive: any leak into a file or the output is unambiguous
SIM_OPTIONS = dict(seed=11, rate_scale=0.01, num_offers=50)  # conftest.sim


def _evidence_files(run_dir: Path) -> list[Path]:
    return [p for p in run_dir.rglob("*") if p.is_file()]


def test_the_example_runs_end_to_end_on_the_simulator_through_the_cli(tmp_path):
    """The issue's "done when": exit 0, the artifacts in the evidence, the workdir's sha256 recorded, the
    setting used, the secret masked in every file the run kept and in what it printed."""
    evidence = tmp_path / "ev"
    p = cli("run", "--sim", "--workdir", str(EXAMPLE), "--setup", "mkdir -p checkpoints", "--artifact", "checkpoints",
            "--artifact", "metrics.json", "--remote-env", "EPOCHS=2", "--remote-secret", f"TRACKER_TOKEN={SECRET}",
            "--evidence-dir", str(evidence), "--json", "--", "python", "train.py", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert SECRET not in p.stdout + p.stderr
    (run_dir,) = [d for d in evidence.iterdir() if d.is_dir()]
    record = json.loads((run_dir / "harness-result.json").read_text())
    assert record["exit_code"] == 0 and record["profile"] == "run"
    assert [s["name"] for s in record["steps"]] == ["setup-1", "run"] and all(s["rc"] == 0 for s in record["steps"])
    # the workdir's sha256 is the reproducible bundle of exactly the files uploaded
    expected = build_workdir_bundle(select_workdir(EXAMPLE))
    assert record["workdir"]["sha256"] == expected.sha256 == record["bundle_sha256"]
    assert record["workdir"]["files"] == 3 and record["workdir"]["path"] == str(EXAMPLE)
    arts = record["artifacts"]
    assert arts["complete"] and arts["files"] == ["checkpoints/model.json", "metrics.json"] and not arts["unmatched"]
    metrics = json.loads((run_dir / "artifacts" / "metrics.json").read_text())
    assert metrics["epochs"] == 2 and metrics["final_loss"] < 0.1  # the setting reached the command
    assert set(json.loads((run_dir / "artifacts" / "checkpoints" / "model.json").read_text())) == {"w", "b"}
    assert "artifacts/metrics.json" in (run_dir / "manifest.sha256").read_text()
    run_log = (run_dir / "steps" / "run.log").read_text()
    assert "tracker token: ***" in run_log and "Epoch 2/2" in run_log
    assert record["remote_env"] == {"EPOCHS": "2", "TRACKER_TOKEN": "***"}
    leaks = [p.name for p in _evidence_files(run_dir) if SECRET.encode() in p.read_bytes()]
    assert leaks == []
    assert record["absence"]["verdict"] == "gone"
    report = (run_dir / "report.html").read_text()
    assert record["workdir"]["sha256"] in report and 'href="artifacts/checkpoints/model.json"' in report


def test_run_workload_pulls_small_artifacts_first_and_names_what_did_not_come_back(tmp_path, monkeypatch):
    """The Python entry point returns the typed result and prints nothing. A huge file cannot crowd out the
    small results (smallest first; it alone is skipped), and a glob that matched nothing fails the run (exit 1)
    naming it; the instance is still deleted and proven gone."""
    from vast_harness import api

    monkeypatch.setattr("vast_harness.run.host_work.PULL_MAX_BYTES", 50_000)
    work = tmp_path / "proj"
    work.mkdir()
    (work / "job.sh").write_text("mkdir -p out\nhead -c 200000 /dev/zero > out/a-huge.bin\n"
                                 "echo '{\"loss\": 0.1}' > out/metrics.json\necho log > out/z.log\necho ran\n")
    result = api.run_workload(["sh", "job.sh"], workdir=work, artifacts=["out", "never/*.pt"], sim=True,
                              evidence_dir=tmp_path / "ev")
    assert isinstance(result, api.WorkloadResult)
    assert result.exit_code == ExitCode.FAILED and "never/*.pt" in result.message
    assert result.record is not None and result.record.artifacts is not None
    arts = result.record.artifacts
    assert arts.files == ["out/metrics.json", "out/z.log"] and arts.skipped == ["out/a-huge.bin"]
    assert arts.unmatched == ["never/*.pt"] and not arts.complete
    assert result.artifacts_dir is not None and (result.artifacts_dir / "out" / "metrics.json").is_file()
    assert not (result.artifacts_dir / "out" / "a-huge.bin").exists()
    assert result.record.absence.verdict == "gone" and result.record.steps[-1].rc == 0
    assert "step run" in result.console  # what the command would have printed, kept rather than printed


def test_a_failing_command_still_gets_its_artifacts_back_with_a_secret_in_one_named(tmp_path):
    """Nothing is lost: the teardown pulls the artifacts of a command that failed. A secret the command wrote
    into one stays there (an artifact is the user's, byte for byte: docs/run.md), named in the record and in a
    warning by the secret's name; the console never shows the value."""
    from vast_harness import api

    work = tmp_path / "proj"
    work.mkdir()
    (work / "fail.sh").write_text('mkdir -p logs\necho "token=$TRACKER_TOKEN loss=nan" > logs/train.log\nexit 3\n')
    result = api.run_workload(["sh", "fail.sh"], workdir=work, artifacts=["logs"], sim=True,
                              remote_secrets={"TRACKER_TOKEN": SECRET}, evidence_dir=tmp_path / "ev")
    assert result.exit_code == ExitCode.FAILED and "rc=3" in result.message
    assert result.record is not None and result.record.artifacts is not None
    arts = result.record.artifacts
    assert arts.files == ["logs/train.log"] and arts.secrets_found == {"logs/train.log": ["TRACKER_TOKEN"]}
    assert result.artifacts_dir is not None
    assert (result.artifacts_dir / "logs" / "train.log").read_text() == f"token={SECRET} loss=nan\n"
    assert result.record.absence.verdict == "gone"
    assert "artifact logs/train.log holds the secret TRACKER_TOKEN" in result.console
    assert SECRET not in result.console


def test_run_workload_prints_nothing_and_a_dry_run_rents_nothing(tmp_path, capsys):
    from vast_harness import api

    result = api.run_workload(["python", "train.py"], workdir=EXAMPLE, sim=True, dry_run=True,
                              evidence_dir=tmp_path / "ev")
    assert result.exit_code == ExitCode.PASSED and result.plan is not None and result.run_id is None
    assert [s["name"] for s in result.plan["steps"]] == ["run"]
    assert result.plan["workdir"]["files"] == 3 and result.plan["workdir"]["path"] == str(EXAMPLE)
    assert capsys.readouterr() == ("", "")
    with pytest.raises(ConfigError, match="--artifact"):
        api.run_workload(["true"], workdir=EXAMPLE, artifacts=["/etc/passwd"], sim=True)


def test_gpu_and_memory_flags_are_requirements_named_per_dropped_offer(tmp_path):
    """--gpu / --min-gpu-ram-gb narrow as [requires] does: one reason per need, the host held to them."""
    from vast_harness import api

    result = api.run_workload(["true"], workdir=EXAMPLE, sim=True, dry_run=True, evidence_dir=tmp_path / "ev",
                              gpus=["RTX 4090"], min_gpu_ram_gb=20)
    assert result.exit_code == ExitCode.PASSED and result.plan is not None
    assert result.plan["requires"]["gpu_names"] == ["RTX 4090"]
    assert result.plan["requires"]["min_gpu_ram_gib"] == pytest.approx(19.53)
    assert result.plan["offer"]["gpu_name"] == "RTX 4090"
    none = api.run_workload(["true"], workdir=EXAMPLE, sim=True, dry_run=True, evidence_dir=tmp_path / "ev",
                            gpus=["H100 SXM"], min_gpu_ram_gb=90)
    assert none.exit_code == ExitCode.NO_OFFER
    assert "GPU memory 24.0 GiB < 87.89 GiB" in none.console and "not one of the GPUs it runs on" in none.console
    assert "not in ['H100 SXM']" not in none.console  # said once, as a requirement, not again as a filter


def test_a_gpu_flag_outside_the_profiles_own_list_is_bad_input():
    from vast_harness.spec.profile import load_profile
    from vast_harness.spec.requires import Requires
    from vast_harness.spec.resolve import with_flag_requires

    # a profile with a GPU list of its own (the shipped ones name none: their requirements are what they need)
    hopper = load_profile("proofs").model_copy(update={"name": "hopper", "requires": Requires(gpu_names=["H100 SXM",
                                                                                                   "H200"])})
    with pytest.raises(ConfigError, match=r"--gpu RTX 4090: profile hopper runs only on H100 SXM, H200"):
        with_flag_requires(hopper, ["RTX 4090"], None)
    narrowed = with_flag_requires(hopper, ["H200", "RTX 4090"], 200)
    assert narrowed.requires.gpu_names == ["H200"] and narrowed.requires.min_gpu_ram_gib == pytest.approx(195.31)


# ----------------------------------------------------------------------------------------- bad input


def _big_workdir(tmp_path: Path) -> Path:
    work = tmp_path / "big"
    work.mkdir()
    (work / "weights.bin").write_bytes(b"\0" * 2_500_000)
    (work / "train.py").write_text("print(1)\n")
    return work


BAD = [
    pytest.param(["--workdir", "{big}", "--workdir-max-mb", "1", "--", "python", "train.py"],
                 ["--workdir", "2.5 MB", "1 MB limit", "weights.bin (2.5 MB)"], id="workdir-over-the-limit"),
    pytest.param(["--workdir", "{example}", "--exclude", "no-such-dir/", "--", "python", "train.py"],
                 ["--exclude", "no-such-dir/", "matches nothing"], id="exclude-matches-nothing"),
    pytest.param(["--workdir", "{example}"], ["no command given", "-- CMD"], id="missing-command"),
    pytest.param(["--workdir", "{example}", "--"], ["no command given"], id="nothing-after-dashes"),
    pytest.param(["--workdir", "{example}", "--image", "pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime", "--",
                  "python", "train.py"], ["--image", "pinned by digest"], id="image-without-digest"),
    pytest.param(["--workdir", "{example}", "--image", "python:3.12@sha256:" + "a" * 64, "--", "true"],
                 ["--image", "names no CUDA version"], id="image-tag-without-cuda"),
    pytest.param(["--workdir", "{example}", "--artifact", "/etc/passwd", "--", "true"],
                 ["--artifact", "relative to the workdir"], id="artifact-absolute"),
    pytest.param(["--workdir", "{example}", "--artifact", "out/../../x", "--", "true"],
                 ["--artifact", "'..'"], id="artifact-climbs-out"),
    pytest.param(["--workdir", "{example}", "--artifact", "out/[ab.json", "--", "true"],
                 ["--artifact", "unclosed '['"], id="artifact-bad-syntax"),
    pytest.param(["--workdir", "{tmp}/nowhere", "--", "true"], ["--workdir", "no such folder"], id="workdir-missing"),
    pytest.param(["--workdir", "{example}", "--setup", " ", "--", "true"], ["--setup #1 is empty"], id="setup-empty"),
    *[pytest.param(["--workdir", "{example}", flag, value, "--", "true"], [flag], id=f"{flag}={value}")
      for flag in ("--min-gpu-ram-gb", "--workdir-max-mb") for value in ("-1", "nan", "inf", "1e300", "", "[/x]")],
    pytest.param(["--workdir", "{example}", "--workdir-max-mb", "0", "--", "true"], ["--workdir-max-mb"],
                 id="workdir-max-mb-zero"),
    pytest.param(["--workdir", "{example}", "--gpu", " ", "--", "true"], ["--gpu"], id="gpu-empty"),
]


@pytest.mark.parametrize(("args", "needles"), BAD)
def test_bad_input_exits_2_naming_it_with_nothing_rented(args, needles, sim: SimServer, tmp_path, monkeypatch,
                                                         capsys, _harness_state_dir):
    values = {"big": str(_big_workdir(tmp_path)), "example": str(EXAMPLE), "tmp": str(tmp_path)}
    argv = [a.format(**values) for a in args]
    monkeypatch.setenv("VAST_API_KEY", "0123456789abcdef")
    monkeypatch.setattr(sys, "argv", ["vast-e2e", "run", "--api-url", sim.url, "--pacing-scale", "0.01",
                                      "--evidence-dir", str(tmp_path / "ev"), *argv])
    calls_before = len(sim.state()["calls"])
    with pytest.raises(SystemExit) as exited:
        cli_app.main()
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    for needle in needles:
        assert needle in err, (needle, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 2, err
    assert sim.state()["calls"][calls_before:] == []  # not even a read: refused before any network call
    ledger = _harness_state_dir / "ledger.jsonl"
    assert not ledger.exists() or ledger.read_text() == ""
    assert not (tmp_path / "ev").exists() or not any((tmp_path / "ev").iterdir())


def test_a_profile_and_a_command_together_are_refused():
    from vast_harness.spec.resolve import RunOptions, resolve

    with pytest.raises(ConfigError, match="a command or a profile, not both"):
        resolve(RunOptions(profile="smoke", command=["true"], sim=True))
    with pytest.raises(ConfigError, match="--workdir applies to `vast-e2e run"):
        resolve(RunOptions(profile="smoke", workdir=".", sim=True))


# ----------------------------------------------------------------------------------------- the workdir rules


def test_the_upload_honours_gitignore_exclude_and_never_follows_a_symlink(tmp_path):
    work = tmp_path / "w"
    (work / "src").mkdir(parents=True)
    (work / "data" / "raw").mkdir(parents=True)
    (work / ".git").mkdir()
    (work / ".git" / "HEAD").write_text("ref\n")
    (work / ".gitignore").write_text("*.ckpt\ndata/raw/\n")
    (work / "src" / ".gitignore").write_text("generated.py\n")
    for rel in ("train.py", "model.ckpt", "src/lib.py", "src/generated.py", "data/raw/x.csv", "data/keep.csv",
                "notes.tmp"):
        (work / rel).write_text(rel)
    secret = tmp_path / "id_ed25519"
    secret.write_text("PRIVATE")
    (work / "key").symlink_to(secret)
    (work / "linked").symlink_to(tmp_path, target_is_directory=True)
    state = work / ".state"
    state.mkdir()
    (state / "ledger.jsonl").write_text("{}\n")
    assert [f.rel for f in select_workdir(work, exclude=["/data", "src/"], skip_dirs=[state]).files] == [
        ".gitignore", "notes.tmp", "train.py"]  # .gitignore syntax: `/data` is anchored at the workdir
    with pytest.raises(ConfigError, match="'/src/lib' matches nothing"):
        select_workdir(work, exclude=["/src/lib"])
    sel = select_workdir(work, exclude=["*.tmp"], skip_dirs=[state])
    assert [f.rel for f in sel.files] == [".gitignore", "data/keep.csv", "src/.gitignore", "src/lib.py", "train.py"]
    assert sel.symlinks == ["key", "linked"]
    assert sel.excluded == 5  # .git/, model.ckpt, data/raw/, src/generated.py, notes.tmp
    assert [(i.path, i.includable) for i in sel.left_out] == [(".state/", False)]  # the harness's own: named
    bundle = build_workdir_bundle(sel)
    assert bundle.workdir is not None and bundle.workdir.sha256 == bundle.sha256
    assert build_workdir_bundle(select_workdir(work, exclude=["*.tmp"], skip_dirs=[state])).sha256 == bundle.sha256
    (work / "train.py").write_text("changed")
    assert build_workdir_bundle(select_workdir(work, exclude=["*.tmp"], skip_dirs=[state])).sha256 != bundle.sha256


def test_the_size_limit_names_the_limit_the_size_and_the_largest_files(tmp_path):
    work = _big_workdir(tmp_path)
    with pytest.raises(ConfigError) as exc:
        select_workdir(work, max_mb=2)
    assert "2.5 MB to upload is over the 2 MB limit" in str(exc.value) and "weights.bin (2.5 MB)" in str(exc.value)
    assert select_workdir(work, max_mb=3).total_bytes == 2_500_009


@pytest.mark.parametrize(("glob", "selected", "not_selected"), [
    ("metrics.json", ["metrics.json"], ["sub/metrics.json"]),
    ("out/*.pt", ["out/a.pt"], ["out/deep/a.pt", "a.pt"]),
    ("out/**/*.pt", ["out/a.pt", "out/deep/a.pt"], ["other/a.pt"]),
    ("checkpoints", ["checkpoints/a.bin", "checkpoints/x/y.bin"], ["checkpoints.txt"]),
    ("**/*.log", ["a.log", "x/y/z.log"], ["a.log.gz"]),
])
def test_artifact_globs_are_anchored_at_the_workdir(glob, selected, not_selected):
    globs = ArtifactGlobs([glob])
    assert [p for p in selected if globs.matching(p)] == selected
    assert [p for p in not_selected if globs.matching(p)] == []


@pytest.mark.parametrize("glob", ["", "/abs", "~/x", "a/../../b", "..", "!neg", "a[b", "a[[b]]", "C:\\x", "a\x1bb"])
def test_bad_artifact_globs_are_refused(glob):
    with pytest.raises(ConfigError, match="--artifact"):
        check_glob("--artifact", glob)


def test_a_profile_file_declares_a_workdir_and_artifacts_beside_it(tmp_path):
    from vast_harness.spec.profile import load_profile

    smoke = (ROOT / "profiles" / "harness" / "smoke.toml").read_text()
    image = next(line for line in smoke.splitlines() if line.startswith("image ="))
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "train.py").write_text("print(1)\n")
    body = (f'name = "mine"\n{image}\nimage_cuda = 12.8\nartifacts = ["metrics.json"]\n'
            '[caps]\nmax_usd = 1\nmax_minutes = 20\n[workdir]\npath = "proj"\nexclude = ["*.tmp"]\n'
            '[[steps]]\nname = "train"\nrun = "python train.py"\n')
    (tmp_path / "mine.toml").write_text(body)
    prof = load_profile(str(tmp_path / "mine.toml"))
    assert prof.workdir is not None and prof.workdir.path == str(tmp_path / "proj")
    (tmp_path / "bad.toml").write_text(body.replace('artifacts = ["metrics.json"]', 'artifacts = ["../up"]'))
    with pytest.raises(ConfigError, match=r"bad.toml: field artifacts.*'\.\.' would leave the workdir"):
        load_profile(str(tmp_path / "bad.toml"))
    (tmp_path / "noworkdir.toml").write_text(body.split("[workdir]")[0] + '[[steps]]\nname = "t"\nrun = "true"\n')
    with pytest.raises(ConfigError, match="declare \\[workdir\\] too"):
        load_profile(str(tmp_path / "noworkdir.toml"))


# The CI workflow example and the action it uses: tests/harness/test_action.py.


def test_the_readme_shows_run_on_its_first_screen_below_the_two_set_up_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    setup = [i for i, line in enumerate(lines) if line.startswith("uv run --extra workload ")]
    run = [i for i, line in enumerate(lines) if line.startswith("uv run vast-e2e run --sim --workdir examples/tiny-train")]
    assert len(setup) == 2 and run and setup[-1] < run[0] < 30
    assert " -- python train.py" in lines[run[0]] and "](docs/run.md)" in "\n".join(lines[:30])


def test_a_sim_run_leaves_the_whole_state_dir_out_of_a_workdir_it_sits_in(tmp_path, monkeypatch):
    """--sim keeps its state in <state>/sim; the real ledger and runs beside it stay home too (red team)."""
    from vast_harness import api

    work = tmp_path / "w"
    state = work / "st"
    (state / "sim").mkdir(parents=True)
    (state / "ledger.jsonl").write_text('{"real": "ledger"}\n')
    (state / "20260101T000000Z-aaaaaa").mkdir()
    (state / "20260101T000000Z-aaaaaa" / "harness-result.json").write_text("{}")
    (work / "a.py").write_text("print(1)\n")
    monkeypatch.setenv("VAST_HARNESS_HOME", str(state))
    monkeypatch.setattr("vast_harness.spec.resolve.user_state_dir", lambda environ=None: state)  # over conftest's
    result = api.run_workload(["python", "a.py"], workdir=work, sim=True, dry_run=True)
    assert result.exit_code == ExitCode.PASSED and result.plan is not None
    assert result.plan["workdir"]["files"] == 1, result.plan["workdir"]


@pytest.mark.parametrize("kwargs", [
    {"command": "python train.py"}, {"artifacts": "metrics.json"}, {"setup": "pip install x"},
    {"gpus": "RTX 4090"}, {"command": ["echo", None]}, {"remote_env": {"A": 1}}, {"remote_secrets": {"A": 1}},
], ids=["command-str", "artifacts-str", "setup-str", "gpus-str", "command-none", "env-int", "secret-int"])
def test_run_workload_refuses_a_string_where_a_list_belongs_before_renting(kwargs, sim: SimServer, monkeypatch):
    """A bare string was split into characters and a host rented for a step `p y t h o n` (red team)."""
    from vast_harness import api

    monkeypatch.setenv("VAST_API_KEY", "0123456789abcdef")
    args = {"command": ["python", "train.py"], "workdir": EXAMPLE, "api_url": sim.url} | kwargs
    command = args.pop("command")
    calls_before = len(sim.state()["calls"])
    with pytest.raises(ConfigError, match="run_workload: ") as refused:
        api.run_workload(command, **args)
    assert "1" not in str(refused.value) or "remote_secrets" not in str(refused.value)
    assert sim.state()["calls"][calls_before:] == []  # refused before any network call


def test_a_secret_in_a_command_a_host_file_name_or_split_by_escapes_is_in_no_file_and_no_output(tmp_path):
    """Red team: the value in clear in harness-result.json, offer-quote.json and report.html (a command, a host
    file's name), and on the console and in `logs` when colour codes or carriage returns split it."""
    secret = "Zq9TopSecretLeak77"
    evidence = tmp_path / "ev"
    script = ('mkdir -p out; touch "out/n-$S"; printf "Zq9Top\\033[0mSecretLeak77\\n"; '
              'printf "AAAAAASecretLeak77\\rZq9Top\\n"')
    # a process of its own: a secret written past Python's streams would show too
    p = cli_process("run", "--sim", "--workdir", str(EXAMPLE), "--setup", f"true {secret}", "--artifact", "out",
                    "--remote-secret", "S", "--evidence-dir", str(evidence), "--", "sh", "-c", script,
                    env={"S": secret}, cwd=tmp_path, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    assert secret not in p.stdout + p.stderr
    (run_dir,) = [d for d in evidence.iterdir() if d.is_dir()]
    assert [f.name for f in _evidence_files(run_dir) if secret.encode() in f.read_bytes() or secret in str(f)] == []
    assert (run_dir / "artifacts" / "out" / "n-***").is_file()
    logs = cli("logs", "--evidence-dir", str(evidence), env={"S": secret}, cwd=tmp_path)
    assert logs.returncode == 0 and "==> step run" in logs.stdout and secret not in logs.stdout + logs.stderr


PRIVATE_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Bl-secretbody-5e1f\n-----END OPENSSH PRIVATE KEY-----\n"


@pytest.mark.parametrize(("root", "swap"), [
    ("vh/evidence", "rm -rf ~/vh/evidence; ln -s {target} ~/vh/evidence"),
    ("vh/work", "cd ~/vh && mv work work.real && ln -s {target} work"),
])
def test_a_pull_root_that_is_a_symlink_on_the_host_is_never_followed(root, swap, tmp_path):
    """Issue 43 F3: the host's evidence folder (or the workdir the artifacts come from) replaced by a symlink to
    a folder outside the host: on --sim that is the user's own disk, a private key in it. Nothing of it comes
    back; the record and a warning name the link, and the run fails as an incomplete pull does."""
    from vast_harness import api

    target = tmp_path / "target"
    (target / ".ssh").mkdir(parents=True)
    (target / ".ssh" / "id_ed25519").write_text(PRIVATE_KEY)
    (target / "a.txt").write_text("outside the host\n")
    work = tmp_path / "proj"
    work.mkdir()
    (work / "a.txt").write_text("the host's own\n")
    ev = tmp_path / "ev"
    result = api.run_workload(["sh", "-c", swap.format(target=target)], workdir=work, artifacts=["a.txt"], sim=True,
                              evidence_dir=ev)
    assert result.exit_code == ExitCode.FAILED, result.console[-3000:]
    leaked = [str(p) for p in ev.rglob("*") if p.is_file() and b"secretbody" in p.read_bytes()]
    assert leaked == []
    assert not [p for p in ev.rglob("*") if p.is_file() and p.read_bytes() == b"outside the host\n"]
    assert result.record is not None
    refused = result.record.pull.symlink if root == "vh/evidence" else result.record.artifacts.symlink
    assert refused == root
    assert f"{root} on the host is a symlink: not followed" in result.console
    assert result.record.absence.verdict == "gone"


def test_pulled_evidence_files_are_private_whatever_their_mode_on_the_host(tmp_path):
    from vast_harness import api

    work = tmp_path / "proj"
    work.mkdir()
    (work / "a.txt").write_text("1\n")
    ev = tmp_path / "ev"
    result = api.run_workload(["sh", "-c", "echo note > ~/vh/evidence/note.txt; chmod 644 ~/vh/evidence/note.txt"],
                              workdir=work, sim=True, evidence_dir=ev)
    assert result.exit_code == ExitCode.PASSED, result.console[-3000:]
    (note,) = ev.rglob("remote/note.txt")
    assert note.stat().st_mode & 0o777 == 0o600


def test_artifacts_whose_masked_names_collide_are_each_kept_recorded_and_checked(tmp_path):
    """Issue 43 F8: `n-$TOK.txt`, `n-$TOK$TOK.txt` and a literal `n-***.txt` mask to names that collide: each
    is saved under its own name, and the record holds each one's sha256 beside the host's, matching the file on
    disk."""
    import hashlib

    from vast_harness import api

    tok = "Tk9xQ2mW7pLz"
    work = tmp_path / "proj"
    work.mkdir()
    (work / "p.sh").write_text('mkdir -p out\nprintf AAAA > "out/n-$TOK.txt"\nprintf BBBB > "out/n-$TOK$TOK.txt"\n'
                               "printf CCCC > 'out/n-***.txt'\n")
    ev = tmp_path / "ev"
    result = api.run_workload(["sh", "p.sh"], workdir=work, artifacts=["out"], sim=True,
                              remote_secrets={"TOK": tok}, evidence_dir=ev)
    assert result.exit_code == ExitCode.PASSED, result.console[-3000:]
    (run_dir,) = [d for d in ev.iterdir() if d.is_dir()]
    arts = json.loads((run_dir / "harness-result.json").read_text())["artifacts"]
    assert len(set(arts["files"])) == 3, arts["files"]
    contents = set()
    for name in arts["files"]:
        data = (run_dir / "artifacts" / name).read_bytes()
        contents.add(data)
        assert arts["sha256"][name] == arts["host_sha256"][name] == hashlib.sha256(data).hexdigest(), name
    assert contents == {b"AAAA", b"BBBB", b"CCCC"} and arts["mismatched"] == []
    assert not [p for p in run_dir.rglob("*") if tok in p.name]
