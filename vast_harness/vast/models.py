"""Pydantic models of what the Vast API returns, with units in the names where Vast's own names lack them.

Vast sends nulls freely, pads some strings, and sends `HostPort` as a string: the models absorb that here
so nothing downstream has to. Unknown fields are ignored (the API grows). Also the SSH endpoint and connect
attempt types, which ssh.py makes and errors.py reports: here both import them without importing each other.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Vast's `actual_status` values, as data (docs/vast-behaviours.md). `error` is terminal for Vast's own QA tool
# (base-image `test_template.py` TERMINAL_STATES); `stopped` is judged with `intended_status` (`failed_reason`).
FAILED_STATUSES = frozenset({"exited", "offline", "unknown", "stopped", "frozen", "error"})
READY_STATUS = "running"
# vast-cli `machines.py` treats these as "stopped before reaching running" while it waits for a boot.
INTENDED_STOP_STATUSES = frozenset({"stopped", "exited"})
# Tokens in `status_msg` that mean the container will not come up (vast-cli machines.py self-test).
STATUS_MSG_ERROR_TOKENS = (
    "error",
    "failed",
    "failure",
    "exception",
    "traceback",
    "oci runtime",
    "permission denied",
    # Vast's own image QA (base-image BAD_STATUS_PATTERNS): a truncated pull "never leaves 'loading'"
    "error response from daemon",
    "failed to pull image",
    "no space left on device",
    "manifest unknown",
    "unauthorized",
    "unexpected eof",
)


def finite_number(value: Any) -> float | None:
    """A finite float (a numeric string accepted), else None: `true` is not 1, and `1e400` (which JSON parses as
    infinity) and NaN are no figure at all."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def epoch(value: Any) -> float | None:
    """A date in epoch seconds: a finite number above zero, else None (a 0 or a negative is no date: an open-ended
    offer may send one, and reading it as 1970 would refuse every such offer)."""
    number = finite_number(value)
    return number if number is not None and number > 0 else None


def finite_price(value: Any) -> float | None:
    """A price field as a finite float >= 0 (numbers sent as strings accepted), else None."""
    number = finite_number(value)
    return number if number is not None and number >= 0 else None


ReadShape = Literal["object", "list", "null", "empty_list"]


class UnreadableShape(ValueError):
    """A per-id read body in none of the shapes below: never absence, never an instance."""


def per_id_row(data: Any, instance_id: int) -> tuple[ReadShape, dict[str, Any] | None]:
    """The row of a per-id read (`GET /api/v0/instances/{id}/`) and the shape it came in. The docs and dstack show
    `{"instances": {...}}`; Vast's own QA tool (base-image `test_template.py`) says `{"instances": [{...}]}` for a
    live instance: both are read. `null` (vast-cli PR 405) and an empty list are "not found" (None; the usual
    absence rules judge it). A list of more than one row, or a listed row of another id, is unreadable."""
    if not isinstance(data, dict) or "instances" not in data:
        raise UnreadableShape("no 'instances' key")
    row = data["instances"]
    if row is None:
        return "null", None
    if isinstance(row, dict):
        return "object", row
    if isinstance(row, list):
        if not row:
            return "empty_list", None
        if len(row) == 1 and isinstance(row[0], dict) and row[0].get("id") == instance_id:
            return "list", row[0]
        raise UnreadableShape(f"'instances' is a list of {len(row)} that is not this one instance")
    raise UnreadableShape("'instances' is neither an object, a list nor null")


class _VastModel(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=False)


@lru_cache(maxsize=4096)  # a market repeats a few dozen driver strings across thousands of offers
def pack_driver_version(version: str) -> int:
    """`535.86.05` -> 535086005, the packed integer the official CLI sends as a filter value."""
    parts = [int(p) for p in version.strip().split(".")]
    while len(parts) < 3:
        parts.append(0)
    major, minor, patch = parts[:3]
    return major * 1_000_000 + minor * 1_000 + patch


class Offer(_VastModel):
    """One row of `POST /api/v0/bundles/`."""

    id: int
    ask_contract_id: int | None = None
    machine_id: int | None = None
    host_id: int | None = None
    gpu_name: str = ""
    num_gpus: int = 0
    gpu_ram_mb: float | None = Field(default=None, alias="gpu_ram")
    compute_cap: int | None = None
    cuda_max_good: float | None = None
    driver_version: str | None = None
    pci_gen: float | None = None
    pcie_bw_gbps: float | None = Field(default=None, alias="pcie_bw")
    gpu_lanes: int | None = None
    # What the host advertises it delivers (the receipt compares, run/receipt.py): GB/s of GPU memory, TFLOP/s
    # summed over the GPUs (Vast does not document the precision), GB/s of NVLink.
    gpu_mem_bw_gbps: float | None = Field(default=None, alias="gpu_mem_bw")
    total_flops: float | None = None
    bw_nvlink_gbps: float | None = Field(default=None, alias="bw_nvlink")
    dph_base: float | None = None
    dph_total: float | None = None
    min_bid_usd_per_h: float | None = Field(default=None, alias="min_bid")  # interruptible: the lowest bid now
    # The bid the harness places on this offer ($/h for the GPU), set by market/offers.py, never read from an answer
    bid_usd_per_h: float | None = Field(default=None, exclude=True)
    storage_cost_usd_per_gb_month: float | None = Field(default=None, alias="storage_cost")
    inet_up_cost_usd_per_gb: float | None = Field(default=None, alias="inet_up_cost")
    inet_down_cost_usd_per_gb: float | None = Field(default=None, alias="inet_down_cost")
    inet_up: float | None = None
    inet_down: float | None = None
    reliability: float | None = None
    reliability2: float | None = None
    verified: bool | None = None
    verification: str | None = None
    rentable: bool | None = None
    rented: bool | None = None
    external: bool | None = None
    geolocation: str | None = None
    direct_port_count: int | None = None
    disk_space_gb: float | None = Field(default=None, alias="disk_space")
    duration_s: float | None = Field(default=None, alias="duration")
    end_date_unix: float | None = Field(default=None, alias="end_date")  # a contract made now ends then
    cpu_cores: int | None = None
    cpu_ram_mb: float | None = Field(default=None, alias="cpu_ram")
    public_ipaddr: str | None = None

    @field_validator("public_ipaddr", "geolocation", "driver_version", "gpu_name", mode="before")
    @classmethod
    def _strip(cls, value: Any) -> Any:
        return value.strip() if isinstance(value, str) else value

    @field_validator("end_date_unix", mode="before")
    @classmethod
    def _date(cls, value: Any) -> float | None:
        return epoch(value)

    @property
    def reliability_score(self) -> float:
        """`reliability2` when sent (dstack filters on it), else `reliability`, else 0."""
        for value in (self.reliability2, self.reliability):
            if value is not None:
                return float(value)
        return 0.0

    @property
    def transfer_usd_per_gb(self) -> float:
        """$/GB for bytes in either direction: the higher of `inet_up_cost` and `inet_down_cost`. The units are
        sourced (search_offers.yaml "$/GB"); whose "up" they name is not, so a wrong guess must not under-count."""
        return max(self.inet_up_cost_usd_per_gb or 0.0, self.inet_down_cost_usd_per_gb or 0.0)

    def dph_at_disk(self, disk_gb: float) -> float:
        """$/h for this offer with `disk_gb` of storage: GPU part plus disk at storage_cost/720.

        `dph_total` already includes the storage the search priced (`allocated_storage`); recomputing from
        `dph_base` makes the figure independent of what the search assumed.
        """
        base = self.dph_base if self.dph_base is not None else (self.dph_total or 0.0)
        storage = self.storage_cost_usd_per_gb_month or 0.0
        return base + disk_gb * storage / 720.0


class PortBinding(_VastModel):
    host_ip: str | None = Field(default=None, alias="HostIp")
    host_port: int = Field(alias="HostPort")

    @field_validator("host_port", mode="before")
    @classmethod
    def _port(cls, value: Any) -> int:
        # Vast sends HostPort as a string ("41022"); show_instance.yaml wrongly shows an int array.
        if isinstance(value, list):
            value = value[0]
        return int(str(value).strip())


class Instance(_VastModel):
    """One instance, from `GET /api/v0/instances/{id}/` or a row of the v1 list."""

    id: int
    label: str | None = None
    actual_status: str | None = None
    intended_status: str | None = None
    cur_state: str | None = None
    next_state: str | None = None
    status_msg: str | None = None
    machine_id: int | None = None
    host_id: int | None = None
    gpu_name: str | None = None
    num_gpus: int | None = None
    driver_version: str | None = None
    cuda_max_good: float | None = None
    public_ipaddr: str | None = None
    ssh_host: str | None = None
    ssh_port: int | None = None
    ports: dict[str, list[PortBinding]] | None = None
    image_runtype: str | None = None
    dph_total: float | None = None
    start_date: float | None = None
    end_date_unix: float | None = Field(default=None, alias="end_date")  # the contract's end: its price holds till then
    is_bid: bool | None = None  # created with a bid (interruptible): show_instance.yaml "created via bidding"

    @field_validator("end_date_unix", mode="before")
    @classmethod
    def _date(cls, value: Any) -> float | None:
        return epoch(value)

    @field_validator("public_ipaddr", "ssh_host", "status_msg", "actual_status", mode="before")
    @classmethod
    def _strip(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip()
            return value or None
        return value

    @field_validator("dph_total", mode="before")
    @classmethod
    def _price(cls, value: Any) -> float | None:
        """$/h as a finite non-negative number, or None: a price we cannot read is never taken as a figure."""
        return finite_price(value)

    @field_validator("ports", mode="before")
    @classmethod
    def _ports(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return None
        # Drop unpublished ports (null bindings) rather than failing the whole instance.
        return {k: v for k, v in value.items() if isinstance(v, list) and v}

    @property
    def direct_ssh(self) -> tuple[str, int] | None:
        """`public_ipaddr` and the host port mapped to 22/tcp, when the host published one."""
        bindings = (self.ports or {}).get("22/tcp")
        if bindings and self.public_ipaddr:
            return self.public_ipaddr, bindings[0].host_port
        return None

    @property
    def proxy_ssh(self) -> tuple[str, int] | None:
        """The `ssh_host` gateway; +1 on the port when the image runs jupyter (vast-cli ssh-url)."""
        if not self.ssh_host or not self.ssh_port:
            return None
        port = self.ssh_port + (1 if "jupyter" in (self.image_runtype or "") else 0)
        return self.ssh_host, port

    @property
    def scheduling(self) -> bool:
        """`stopped` on its way to `running`: how a restart (and, per the docs, an on-demand create waiting for its
        GPU) shows the Scheduling phase (manage-instances.mdx: "Instance enters `SCHEDULING` status"). Pending,
        bounded by the boot deadline; `stopped` with any other intent fails fast."""
        return self.actual_status == "stopped" and self.intended_status == READY_STATUS

    @property
    def failed_reason(self) -> str | None:
        """Why this instance will never become ready, or None while it still may."""
        if self.actual_status in FAILED_STATUSES and not self.scheduling:
            return f"actual_status={self.actual_status}"
        if self.cur_state == self.intended_status == self.next_state == "stopped":
            return "all states stopped (outbid or unschedulable)"
        if self.intended_status in INTENDED_STOP_STATUSES:  # the official CLI's early stop (machines.py)
            return f"intended_status={self.intended_status} before reaching running"
        msg = (self.status_msg or "").lower()
        if msg and not msg.startswith("success") and any(t in msg for t in STATUS_MSG_ERROR_TOKENS):
            return f"status_msg: {self.status_msg}"
        return None

    @property
    def paused(self) -> str | None:
        """Why an interruptible instance reads as outbid or paused, or None. What an outbid shows is UNCONFIRMED
        (docs/limits.md): every stopped, paused or scheduling shape the sources name counts (dstack: all three
        states `stopped`; SkyPilot: stopped, exited, frozen; the console's Scheduling and Inactive)."""
        states = {self.actual_status, self.cur_state, self.intended_status, self.next_state}
        shapes = {"stopped", "exited", "frozen", "paused", "inactive", "scheduling"}
        hit = sorted(s for s in states if isinstance(s, str) and s.lower() in shapes)
        return None if not hit else f"reads {', '.join(hit)} (actual_status={self.actual_status})"

    @property
    def is_ready(self) -> bool:
        return self.actual_status == READY_STATUS and (self.direct_ssh or self.proxy_ssh) is not None


class User(_VastModel):
    """`GET /api/v0/users/current/`. `credit` vs `balance` is UNCONFIRMED; we read both."""

    id: int | None = None
    email: str | None = None
    credit: float | None = None
    balance: float | None = None
    can_pay: bool | None = None

    @field_validator("credit", "balance", mode="before")
    @classmethod
    def _finite_money(cls, value: Any) -> float | None:
        """A money figure is a finite number: anything else is no figure, and nothing is trusted from it."""
        return finite_number(value)

    @property
    def available_usd(self) -> float:
        """The spendable amount: `credit` when sent (the docs' example), else `balance`."""
        if self.credit is not None:
            return float(self.credit)
        return float(self.balance or 0.0)

    def __repr__(self) -> str:  # never show the email in logs by accident
        return f"User(id={self.id}, credit={self.credit}, balance={self.balance})"


class CreateResult(_VastModel):
    """`PUT /api/v0/asks/{id}/` success body. `instance_api_key` is a secret: excluded from dumps."""

    success: bool = True
    new_contract: int = Field(gt=0)  # an emptied or zero id is an unreadable answer, never "instance 0"
    instance_api_key: str | None = Field(default=None, exclude=True, repr=False)


class CopyEndpoint(_VastModel):
    """`PUT /api/v0/commands/rsync/`'s answer, the fields the official CLI reads (cli/commands/storage.py::copy):
    off an instance `src_addr`/`src_port`, onto one `dst_addr`/`dst_port`. Their exact shape on Vast is
    UNCONFIRMED (the canary records it)."""

    success: bool = False
    msg: str | None = None
    src_addr: str | None = None
    src_port: int | None = None
    dst_addr: str | None = None
    dst_port: int | None = None


class PendingPriceIncrease(_VastModel):
    """A host's raise on a running contract, pending the renter's answer: a row of
    `GET /api/v0/instances/pending-price-increases/` (vast-cli `vastai/api/price_increase.py`). The new prices
    apply only from the contract's end date, and only once accepted (the CLI's help)."""

    pending_price_increase_id: int
    contract_id: int
    old_gpu_costpersec: float | None = None
    new_gpu_costpersec: float | None = None
    old_disk_ram_costpersec: float | None = None
    new_disk_ram_costpersec: float | None = None
    contract_end_date: float | None = None
    ask_end_date: float | None = None

    @field_validator("old_gpu_costpersec", "new_gpu_costpersec", "old_disk_ram_costpersec",
                     "new_disk_ram_costpersec", "contract_end_date", "ask_end_date", mode="before")
    @classmethod
    def _number(cls, value: Any) -> float | None:
        return finite_number(value)

    @property
    def factor(self) -> float | None:
        """How many times the contract's price the new one is: the largest of the GPU's and the disk's ratios
        (unit-free, so neither rate's unit matters); None when no pair is readable."""
        ratios = [new / old for old, new in ((self.old_gpu_costpersec, self.new_gpu_costpersec),
                                             (self.old_disk_ram_costpersec, self.new_disk_ram_costpersec))
                  if old is not None and new is not None and old > 0 and new >= 0]
        return max(ratios) if ratios else None


class InstancePage(_VastModel):
    """One page of `GET /api/v1/instances/`."""

    instances: list[Instance] = Field(default_factory=list)
    total_instances: int | None = None
    next_token: str | None = None


