"""No host and no API answer writes to the user's terminal: step output with OSC 52 (clipboard), OSC 0 (title),
cursor-up + erase-line forging a result line, clear screen and an 8-bit CSI, and ESC bytes in API fields
(`gpu_name`, `geolocation`) through `offers` and `--dry-run`, reach the console escaped. The step log keeps
the bytes as the host sent them."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from pydantic import SecretStr

from vast_harness.cli.tables import show_offers, show_plan
from vast_harness.console.output import Output
from vast_harness.console.terminal import safe_text, terminal_safe
from vast_harness.host.bundle import build_bundle
from vast_harness.market.plan import choose_offers, plan_run
from vast_harness.run.runner import GuardedRun
from vast_harness.sim import SimServer
from vast_harness.spec.profile import Step, load_driver_policy
from vast_harness.spec.resolve import RunOptions, resolve
from vast_harness.vast.client import VastClient

SCALE = 0.01
KEY = "sim-terminal-key"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e]")  # what must never reach the terminal unescaped


@pytest.fixture(scope="module")
def sim():
    with SimServer(seed=22, rate_scale=SCALE, boot_seconds=0.1, num_offers=300) as server:
        yield server


def test_terminal_safe_escapes_every_control_character_and_keeps_text():
    assert terminal_safe("a\x1b[2Jb\tc") == "a\\x1b[2Jb\tc"
    assert terminal_safe("\u009b\u202e\x7f\n") == "\\x9b\\u202e\\x7f\\x0a"
    assert terminal_safe("attention backend: flash · 5090 ✓") == "attention backend: flash · 5090 ✓"
    assert safe_text("[bold]x[/]").plain == "[bold]x[/]"


def _strip_rich_styles(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)  # rich's own SGR colours (when a terminal is forced)


def test_terminal_safe_escapes_every_format_and_separator_character():
    # Every control, format and line/paragraph separator is escaped, not only U+202E and the C1 controls: U+061C
    # (a bidi mark), U+2028 (a newline to some readers), U+200B, U+FEFF, U+00AD and the tag characters too.
    import unicodedata

    unsafe = [chr(c) for c in range(0x110000)
              if unicodedata.category(chr(c)) in ("Cc", "Cf", "Zl", "Zp") and chr(c) != "\t"]
    left = [f"U+{ord(ch):04X}" for ch in unsafe if terminal_safe(f"a{ch}b") == f"a{ch}b"]
    assert not left, left
    assert terminal_safe("x\u2028y\U000e0041z") == "x\\u2028y\\U000e0041z"
    for invisible in "\u3164\u034f\ufe0f\U000e0100\uffff\u115f\uffa0":  # render as nothing, though not Cf
        assert terminal_safe(invisible) != invisible, f"U+{ord(invisible):04X}"
    assert terminal_safe("naïve café 日本 ✓") == "naïve café 日本 ✓"  # text stays text


def test_hostile_step_output_reaches_the_console_escaped_and_the_log_as_sent(sim, tmp_path, capsys):
    # OSC 52, OSC 0, cursor-up + erase-line, clear screen, 8-bit CSI, RLO, CR, in printf's notation (U+009B and U+202E as UTF-8; a lone 0x9b as well)
    # (a CR: what came before it is overwritten, as on a terminal, and what follows is still escaped)
    printf = ("overwritten\\r\\x1b]52;c;aGVsbG8=\\x07\\x1b]0;pwned\\x07\\x1b[1A\\x1b[2K\\x1b[2J\\xc2\\x9b2J"
              "\\xe2\\x80\\xae\\x9b5n")
    run_cmd = f"printf '{printf}exit 0: passed\\n'; printf '\\x1b]52;c;c2VjcmV0\\x07\\n' >&2"
    spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path / "ev", proof_interval_s=0.05),
                   environ={})
    prof = spec.profile.model_copy(update={"steps": [Step(name="hostile", run=run_cmd, timeout_s=20)]})
    spec = spec.model_copy(update={"profile": prof, "api_url": sim.url, "api_key": SecretStr(KEY)}
        ).with_timings(teardown_margin_s=2.0)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output())
        result = run.execute()
    captured = capsys.readouterr()
    assert result.exit_code in (0, 4), result.message
    for stream in (captured.out, captured.err):
        assert not RAW.search(_strip_rich_styles(stream).replace("\n", "")), repr(stream[-500:])
    assert "\\x1b]52;c;aGVsbG8=\\x07" in captured.out and "\\x9b2J" in captured.out
    assert "\\x1b]52;c;c2VjcmV0\\x07" in captured.out  # stderr lines are shown on the console too, escaped
    log = (run.ev.dir / "steps" / "hostile.log").read_bytes()
    assert b"\x1b]52;c;aGVsbG8=\x07" in log and "\u009b".encode() in log  # the log keeps what was sent
    assert b"overwritten\r" in log and "overwritten" not in captured.out


class HostileOffers(httpx.HTTPTransport):
    """Every offer the search returns carries ESC sequences in gpu_name and geolocation."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if request.url.path.rstrip("/").endswith("/bundles"):
            response.read()
            data = response.json()
            for offer in data.get("offers") or []:
                offer["gpu_name"] = "RTX\x1b[2J 4090\x1b]0;pwned\x07"
                offer["geolocation"] = "\x1b]52;c;aGk=\x07Oslo\u009b1A"
            return httpx.Response(response.status_code, json=data)
        return response


def test_api_fields_reach_offers_and_the_dry_run_escaped(sim, tmp_path, capsys):
    spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path / "ev", dry_run=True), environ={})
    spec = spec.model_copy(update={"api_url": sim.url, "api_key": SecretStr(KEY)})
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE, transport=HostileOffers()) as client:
        choice = choose_offers(spec, client, load_driver_policy(), build_bundle(), credit_usd=100.0)
        show_offers(Output(), choice)
        show_plan(Output(), plan_run(spec, client, load_driver_policy(), build_bundle()))
        json_out = Output(json_mode=True)
        show_offers(json_out, choice)
    captured = capsys.readouterr()
    text = captured.out[: captured.out.rindex("{")] if "{" in captured.out else captured.out
    assert choice.ranked
    assert not RAW.search(_strip_rich_styles(text).replace("\n", "")), repr(text[-800:])
    assert "\\x1b]52;c;aGk=\\x07Oslo" in text and "RTX\\x1b[2J" in text
    payload = json.loads(captured.out[captured.out.rindex("{\n  \"ranked\""):])
    assert payload["ranked"][0]["location"].startswith("\x1b]52")  # --json keeps the value (json escapes it)
