"""`--interruptible`: a run on Vast's bid (interruptible) instances, and what it does when one is outbid.

The flags, validated once: the bid (`auto`: the offer's `min_bid` plus a margin; or a fixed $/h within Vast's
0.001-128 range), how many outbids the worst case covers (`--max-interruptions`), the user's checkpoint folder
(inside the workdir) and the command that resumes from it, and whether an outbid host is replaced at once or
waited for (`--on-outbid wait:MINUTES`). Bad input is exit 2 before anything is rented (docs/interruptible.md).
"""

from __future__ import annotations

from pathlib import PurePosixPath

from pydantic import BaseModel, ConfigDict, Field

from vast_harness.errors import ConfigError

MIN_BID_USD = 0.001  # Vast's bid range (OpenAPI create_instance.yaml `price`)
MAX_BID_USD = 128.0
# A replacement host may bill up to this multiple of the first host's $/h (the cheapest offer is seldom rentable
# twice: its machine is excluded after an outbid); the worst case prices the whole time cap at it
REPLACEMENT_HEADROOM = 2.0
AUTO_MARGIN = 0.10  # `--bid auto`: min_bid plus this share, so a small rise in the minimum does not outbid us at once
DEFAULT_MAX_INTERRUPTIONS = 2
MAX_INTERRUPTIONS = 20
DEFAULT_CHECKPOINT_MAX_MB = 1024.0  # the most one salvage copies (and the worst case counts per interruption)
MAX_WAIT_MINUTES = 24 * 60.0
RSYNC_MISSING = ("--checkpoint needs rsync on this machine: the copy off a stopped Vast instance is rsync's, as "
                 "`vastai copy` runs it")


class Interruptible(BaseModel):
    """A run's interruptible terms. `bid_usd_per_h` None is `--bid auto`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bid_usd_per_h: float | None = Field(default=None, ge=MIN_BID_USD, le=MAX_BID_USD)
    auto_margin: float = AUTO_MARGIN
    max_interruptions: int = Field(default=DEFAULT_MAX_INTERRUPTIONS, ge=0, le=MAX_INTERRUPTIONS)
    checkpoint: str | None = None  # relative to the workdir, POSIX
    resume: str | None = None  # the command that resumes from the checkpoint (else the run's own command)
    wait_minutes: float | None = None  # `--on-outbid wait:MINUTES`: wait for the husk to resume, then continue
    checkpoint_max_mb: float = DEFAULT_CHECKPOINT_MAX_MB
    headroom: float = REPLACEMENT_HEADROOM

    def bid_for(self, min_bid_usd_per_h: float) -> float:
        """The bid placed on an offer whose current minimum is `min_bid_usd_per_h`."""
        if self.bid_usd_per_h is not None:
            return self.bid_usd_per_h
        return round(min(MAX_BID_USD, max(MIN_BID_USD, min_bid_usd_per_h * (1.0 + self.auto_margin))), 6)

    @property
    def bid_shown(self) -> str:
        if self.bid_usd_per_h is not None:
            return f"${self.bid_usd_per_h:.4f}/h"
        return f"auto (min_bid + {self.auto_margin:.0%})"

    @property
    def checkpoint_max_bytes(self) -> int:
        return int(self.checkpoint_max_mb * 1_000_000) if self.checkpoint else 0


def parse_interruptible(*, interruptible: bool, bid: str | None, max_interruptions: int | None,
                        checkpoint: str | None, resume: str | None, on_outbid: str | None,
                        workdir: str | None) -> Interruptible | None:
    """The flags as terms, or None for an on-demand run; ConfigError (exit 2) naming the flag otherwise."""
    given = [name for name, value in (("--bid", bid), ("--max-interruptions", max_interruptions),
                                      ("--checkpoint", checkpoint), ("--resume", resume), ("--on-outbid", on_outbid))
             if value is not None]
    if not interruptible:
        if given:
            raise ConfigError(f"{', '.join(given)}: only with --interruptible")
        return None
    bid_usd = None
    if bid is not None and bid.strip().lower() != "auto":
        try:
            bid_usd = float(bid)
        except ValueError:
            raise ConfigError(f"--bid: 'auto' or a price in $/h, got {bid!r}") from None
        if not MIN_BID_USD <= bid_usd <= MAX_BID_USD:
            raise ConfigError(f"--bid {bid_usd:g} is outside Vast's bid range {MIN_BID_USD:g}-{MAX_BID_USD:g} $/h")
    if max_interruptions is not None and not 0 <= max_interruptions <= MAX_INTERRUPTIONS:
        raise ConfigError(f"--max-interruptions must be 0-{MAX_INTERRUPTIONS}, got {max_interruptions}")
    if resume is not None and checkpoint is None:
        raise ConfigError("--resume needs --checkpoint DIR: without a folder to salvage there is nothing to resume from")
    if resume is not None and not resume.strip():
        raise ConfigError("--resume: an empty command")
    if checkpoint is not None:
        checkpoint = checked_checkpoint(checkpoint, workdir)
    wait = None
    if on_outbid is not None:
        kind, _, minutes = on_outbid.partition(":")
        if kind == "replace" and not minutes:
            wait = None
        elif kind == "wait":
            try:
                wait = float(minutes)
            except ValueError:
                raise ConfigError(f"--on-outbid: 'replace' or 'wait:MINUTES', got {on_outbid!r}") from None
            if not 0 < wait <= MAX_WAIT_MINUTES:
                raise ConfigError(f"--on-outbid wait:{minutes}: minutes must be > 0 and at most {MAX_WAIT_MINUTES:g}")
        else:
            raise ConfigError(f"--on-outbid: 'replace' or 'wait:MINUTES', got {on_outbid!r}")
    return Interruptible(bid_usd_per_h=bid_usd,
                         max_interruptions=DEFAULT_MAX_INTERRUPTIONS if max_interruptions is None else max_interruptions,
                         checkpoint=checkpoint, resume=resume, wait_minutes=wait)


def checked_checkpoint(path: str, workdir: str | None) -> str:
    """The checkpoint folder as a POSIX path relative to the workdir; ConfigError for one outside it (absolute,
    `..`, or `~`): the salvage copies only the user's own folder, never anything else of the host."""
    if workdir is None:
        raise ConfigError("--checkpoint is for `vast-e2e run -- CMD`: the folder is relative to its workdir")
    raw = path.strip()
    pure = PurePosixPath(raw)
    if not raw or raw.startswith("~") or pure.is_absolute() or ".." in pure.parts:
        raise ConfigError(f"--checkpoint {path!r} is outside the workdir: give a folder relative to it, e.g. "
                          "checkpoints")
    normal = pure.as_posix().strip("/")
    if normal in ("", "."):
        raise ConfigError("--checkpoint is the whole workdir: give the folder the command writes its checkpoints to")
    return normal
