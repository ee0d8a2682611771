"""Run spec resolution: precedence, key handling, and every bad input named with exit 2."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from vast_harness.caps.meter import minimum_cap_s, teardown_budget_s
from vast_harness.console.output import Output
from vast_harness.errors import ConfigError
from vast_harness.run.runner import GuardedRun
from vast_harness.spec.profile import load_driver_policy, load_profile
from vast_harness.spec.resolve import RunOptions, resolve
from vast_harness.spec.user import read_api_key
from vast_harness.spec.values import mask_env, parse_remote_env
from vast_harness.timings import Timings
from vast_harness.vast.client import VastClient


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "vast.key"
    path.write_text("k-123\n")
    path.chmod(0o600)
    return path


def test_flags_beat_environment_beat_profile(key_file):
    spec = resolve(RunOptions(profile="mfu", key_file=key_file, num_gpus=4, max_usd=2.5, remote_env=["HT_MFU_MB=16"]),
                   environ={"VAST_URL": "http://127.0.0.1:9"})
    assert spec.filters.num_gpus == 4 and spec.caps.max_usd == 2.5
    assert spec.caps.max_minutes == 60  # from the profile
    assert spec.remote_env["HT_MFU_MB"] == "16" and spec.remote_env["HT_MFU_WORLDS"] == "4"  # follows --num-gpus
    assert spec.api_url == "http://127.0.0.1:9"
    assert (
        resolve(RunOptions(profile="mfu", key_file=key_file, api_url="https://a.b"),
                environ={"VAST_URL": "https://c.d"}).api_url
        == "https://a.b"
    )


def test_eight_gpu_qualified_sets_eight_and_refuses_any_driver(key_file):
    assert (
        resolve(RunOptions(profile="mfu", key_file=key_file, eight_gpu_qualified=True),
                environ={}).filters.num_gpus == 8
    )
    with pytest.raises(ConfigError, match="contradict"):
        resolve(RunOptions(profile="mfu", key_file=key_file, eight_gpu_qualified=True, any_driver=True), environ={})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"profile": "nope"}, "unknown profile"),
        ({"remote_env": ["NOEQUALS"]}, "--remote-env"),
        ({"remote_env": ["1BAD=x"]}, "--remote-env"),
        ({"max_usd": 0}, "--max-usd must be positive"),
        ({"max_usd": -1}, "--max-usd must be positive"),
        ({"max_usd": float("nan")}, "--max-usd must be positive"),
        ({"max_minutes": 0}, "--max-minutes must be positive"),
        ({"num_gpus": 0}, "--num-gpus"),
        ({"boot_retries": -1}, "--boot-retries"),
        ({"api_url": "ftp://x"}, "not an http"),
        ({"api_url": "https://x/?api_key=1"}, "query string"),
    ],
)
def test_bad_input_is_a_config_error_naming_the_flag(key_file, kwargs, match):
    kwargs = {"profile": "mfu", "key_file": key_file} | kwargs
    with pytest.raises(ConfigError, match=match):
        resolve(RunOptions(**kwargs), environ={})


def test_key_file_must_not_be_group_or_world_readable(key_file):
    key_file.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        read_api_key(key_file)


def test_unreadable_or_missing_key(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        read_api_key(tmp_path / "missing.key")
    with pytest.raises(ConfigError, match="VAST_API_KEY"):
        read_api_key(None, environ={})
    assert read_api_key(None, environ={"VAST_API_KEY": " abc "}).get_secret_value() == "abc"


def test_key_is_secret_in_reprs(key_file):
    spec = resolve(RunOptions(profile="smoke", key_file=key_file), environ={})
    assert "k-123" not in repr(spec) and "k-123" not in str(spec.model_dump())


def test_remote_env_parsing_and_secret_masking():
    env = parse_remote_env(["A=1", "B=x=y"])
    assert env == {"A": "1", "B": "x=y"}
    assert mask_env(env) == {"A": "***", "B": "***"}


def test_settings_are_shown_and_secrets_masked_in_the_spec(tmp_path):
    spec = resolve(RunOptions(profile="smoke", sim=True, remote_env=["BAR=flash"], remote_secret=["TOK=a", "FROM_ENV"]),
                   environ={"FROM_ENV": "env-secret-value"})
    assert spec.shown_remote_env == {"OMP_NUM_THREADS": "1", "BAR": "flash", "TOK": "***", "FROM_ENV": "***"}
    assert spec.host_env["TOK"] == "a" and spec.host_env["FROM_ENV"] == "env-secret-value"
    assert "env-secret-value" not in repr(spec) and "env-secret-value" not in str(spec.model_dump())
    assert spec.redactor.text("x a env-secret-value") == "x *** ***"


def test_secret_file_follows_the_key_file_rule_and_never_echoes_values(tmp_path):
    path = tmp_path / "secrets.env"
    path.write_text("# comment\nHF_TOKEN=hf-value-123\n\nWANDB=w\n")
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        resolve(RunOptions(profile="smoke", sim=True, remote_secret_file=path), environ={})
    path.chmod(0o600)
    spec = resolve(RunOptions(profile="smoke", sim=True, remote_secret_file=path), environ={})
    assert sorted(spec.remote_secrets) == ["HF_TOKEN", "WANDB"]
    path.write_text("HF_TOKEN hf-value-123\n")
    with pytest.raises(ConfigError) as exc:
        resolve(RunOptions(profile="smoke", sim=True, remote_secret_file=path), environ={})
    assert "hf-value-123" not in str(exc.value) and "entry 1" in str(exc.value)


@pytest.mark.parametrize(("kw", "needle"), [
    ({"remote_secret": ["MISSING"]}, "not set in this environment"),
    ({"remote_secret": ["A=1"], "remote_env": ["A=2"]}, "given both"),
    ({"remote_secret": ["1X=1"]}, "--remote-secret"),
])
def test_bad_secrets_are_refused_naming_the_flag(kw, needle):
    with pytest.raises(ConfigError, match=needle):
        resolve(RunOptions(profile="smoke", sim=True, **kw), environ={})


def test_profiles_are_valid_and_pinned():
    for name in ("mfu", "proofs", "smoke"):
        spec = resolve(RunOptions(profile=name, sim=True), environ={})
        assert "@sha256:" in spec.profile.image
    proofs = resolve(RunOptions(profile="proofs", sim=True), environ={}).profile
    assert proofs.boot_retries == 0 and proofs.pytest_node_ids


@pytest.mark.parametrize(("old", "new", "field"), [
    ("max_usd = 0.5", 'max_usd = "0.5"', "caps.max_usd"),  # a string is not silently a number
    ("boot_retries = 1", "boot_retries = true", "boot_retries"),
    ('name = "smoke"', "name = 7", "name"),
])
def test_a_profile_value_of_the_wrong_type_is_refused_not_coerced(tmp_path, old, new, field):
    src = Path(__file__).resolve().parents[2] / "profiles"
    (tmp_path / "harness").mkdir()
    text = (src / "harness" / "smoke.toml").read_text()
    assert old in text
    (tmp_path / "harness" / "smoke.toml").write_text(text.replace(old, new, 1))
    with pytest.raises(ConfigError, match=field):
        resolve(RunOptions(profile="smoke", sim=True), environ={}, profiles_dir=tmp_path)


def test_unpinned_image_is_refused(tmp_path):
    src = Path(__file__).resolve().parents[2] / "profiles"
    (tmp_path / "harness").mkdir()
    text = (src / "harness" / "smoke.toml").read_text().replace("@sha256:", ":latest#")
    (tmp_path / "harness" / "smoke.toml").write_text(text)
    with pytest.raises(ConfigError, match="pinned by digest"):
        resolve(RunOptions(profile="smoke", sim=True), environ={}, profiles_dir=tmp_path)



@pytest.mark.parametrize(("raw", "needle"), [("torch", "expected torch=VERSION"), ("gpu=1", "expected torch="),
                                             ("cuda=thirteen", "cuda"), ("cuda=", "cuda"),
                                             ("torch=1.0,torch=2.0", "torch is given twice")])
def test_a_bad_image_expect_is_refused_naming_the_flag(tmp_path, raw, needle):
    with pytest.raises(ConfigError, match="--image-expect") as info:
        resolve(RunOptions(profile="proofs", sim=True, evidence_dir=tmp_path, image_expect=raw), environ={})
    assert needle in str(info.value)


def test_image_expect_is_refused_against_a_real_api_unless_acknowledged(tmp_path):
    env = {"VAST_API_KEY": "k" * 64}
    with pytest.raises(ConfigError, match="--image-expect-ack"):
        resolve(RunOptions(profile="proofs", evidence_dir=tmp_path, image_expect="cuda=13.0"), environ=env)
    spec = resolve(RunOptions(profile="proofs", evidence_dir=tmp_path, image_expect="cuda=13.0", image_expect_ack=True),
                   environ=env)
    assert spec.image_expect_override is not None and spec.image_expect_override.cuda == "13.0"
    assert spec.image_expect_override.torch == "2.11.0"  # the rest keep the profile's values
    assert any("--expect-cuda 13.0 " in s.run for s in spec.profile.steps)
    with pytest.raises(ConfigError, match="nothing to override"):
        resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path, image_expect="cuda=13.0"), environ={})
    with pytest.raises(ConfigError, match="none was given"):
        resolve(RunOptions(profile="proofs", sim=True, evidence_dir=tmp_path, image_expect_ack=True), environ={})


def test_the_create_sends_the_digest_pinned_form():
    ref = load_profile("proofs").image_ref
    assert ref.create_form == f"{ref.repo}@{ref.digest}" and ":" not in ref.create_form.split("@")[0]


@pytest.mark.parametrize("edit, needle", [
    (lambda t: t.replace("[remote_env]\n", '[remote_env]\n"X;echo INJECTED;Y" = "1"\n', 1), "not a shell variable"),
    (lambda t: t.replace("[remote_env]\n", '[remote_env]\n"A B" = "1"\n', 1), "not a shell variable"),
    (lambda t: t.replace("disk_gb = ", "disk_gb = inf #"), "disk_gb"),
    (lambda t: t + "\nx = " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
], ids=["env-key-injection", "env-key-space", "disk-inf", "toml-5000-deep"])
def test_a_bad_profile_file_is_refused_before_anything_is_rented(tmp_path, edit, needle):
    # Each is refused by the profile check (exit 2), before anything is rented: not left to fail after renting
    # ("unexpected ValueError", exit 1), in the search (inf in the request) or in tomllib (RecursionError).
    from vast_harness.spec.profile import PROFILES_DIR

    text = (PROFILES_DIR / "harness" / "smoke.toml").read_text()
    if "disk_gb = " not in text:
        text = text.replace('name = "smoke"', 'name = "smoke"\ndisk_gb = 40', 1)
    path = tmp_path / "mine.toml"
    path.write_text(edit(text))
    with pytest.raises(ConfigError) as err:
        resolve(RunOptions(profile=str(path), sim=True, dry_run=True, evidence_dir=tmp_path / "ev"), environ={})
    assert needle in str(err.value)


# ------------------------------------------------------------------------------------ the timing table


def test_the_two_timing_tables_set_the_same_fields_and_describe_both_values():
    real, sim = Timings.real(), Timings.sim()
    fields = set(Timings.model_fields)
    assert real.model_fields_set == sim.model_fields_set == fields  # no value left to a shared default
    for name, info in Timings.model_fields.items():
        text = info.description or ""
        # each field's description states both values, so the table and its reasons cannot drift apart
        assert re.search(rf"Vast: {getattr(real, name):g}\b", text), (name, text)
        assert re.search(rf"Simulator: {getattr(sim, name):g}\b", text), (name, text)


@pytest.mark.parametrize(("sim", "table"), [(True, Timings.sim()), (False, Timings.real())], ids=["sim", "real"])
def test_a_resolved_spec_carries_its_targets_table(tmp_path, key_file, sim, table):
    spec = resolve(RunOptions(profile="smoke", sim=sim, key_file=None if sim else key_file, dry_run=True,
                              state_dir=tmp_path), environ={})
    assert spec.timings == table
    assert (spec.proof_interval_s, spec.teardown_margin_s, spec.poll_s, spec.deadman_grace_s, spec.pacing_scale) == (
        table.proof_interval_s, table.teardown_margin_s, table.poll_s, table.deadman_grace_s, table.pacing_scale)
    assert minimum_cap_s(spec.timings) == table.min_boot_s + table.teardown_margin_s
    # what the run derives from them (the meter's margin, the read-lag window, the teardown budget)
    with VastClient("k", base_url="http://127.0.0.1:9") as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(quiet=True))
    assert run.meter.teardown_margin_s == table.teardown_margin_s
    assert run.state.read_lag_window_s == table.read_lag_window_s
    assert run.state.teardown_budget_s == teardown_budget_s(table.proof_interval_s)


@pytest.mark.parametrize("sim", [True, False], ids=["sim", "real"])
def test_timing_flags_win_over_the_table(tmp_path, key_file, sim):
    table = Timings.sim() if sim else Timings.real()
    spec = resolve(RunOptions(profile="smoke", sim=sim, key_file=None if sim else key_file, dry_run=True,
                              state_dir=tmp_path, api_url="http://127.0.0.1:9", proof_interval_s=0.05, poll_s=0.3,
                              pacing_scale=0.02), environ={})
    assert spec.timings == table.model_copy(update={"proof_interval_s": 0.05, "poll_s": 0.3, "pacing_scale": 0.02})


def test_a_spec_copy_refuses_a_timing_it_would_drop_and_with_timings_validates(tmp_path):
    spec = resolve(RunOptions(profile="smoke", sim=True, dry_run=True, state_dir=tmp_path), environ={})
    with pytest.raises(TypeError, match="poll_s"):
        spec.model_copy(update={"poll_s": 3600.0})  # not a field: pydantic would drop it without a word
    assert spec.with_timings(poll_s=3600.0).poll_s == 3600.0 and spec.poll_s == Timings.sim().poll_s
    with pytest.raises(ValidationError):
        spec.with_timings(teardown_margin_s=-1.0)
    with pytest.raises(ValidationError):
        spec.with_timings(poll_margin_s=1.0)


def test_the_embedded_simulator_boots_and_paces_as_the_sim_table_says(tmp_path, monkeypatch):
    import vast_harness.sim as sim_pkg
    from vast_harness.cli import app as cli

    started: dict = {}

    class Recorder:
        url = "http://127.0.0.1:9"

        def __init__(self, **kwargs) -> None:
            started.update(kwargs)

        def __enter__(self) -> Recorder:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    monkeypatch.setattr(sim_pkg, "SimServer", Recorder)
    spec = resolve(RunOptions(profile="smoke", sim=True, dry_run=True, state_dir=tmp_path), environ={})
    with cli._api_target(spec) as target:
        assert target.api_url == Recorder.url and target.pacing_scale == Timings.sim().pacing_scale
    assert started["boot_seconds"] == Timings.sim().min_boot_s
    assert started["rate_scale"] == Timings.sim().pacing_scale
