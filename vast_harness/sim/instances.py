"""Instance records: billing arithmetic, the Vast JSON shape, and the v1 list query (filters, keyset).

Billing accrues per second from create to destroy at a rate that follows the status: storage only while
pending (null, loading, scheduling), `dph_total` (at the created disk size) from `running`, storage only while
stopped, exited or in error, nothing while offline (`guides/reference/billing.mdx`: GPU "in the active/connected
state"; `manage-instances.mdx`: "Not charged during loading"). SFTP bytes add bandwidth: written to the host at `inet_down_cost`,
read from it at `inet_up_cost`, $/GB with GB = 1e9 bytes.

A contract keeps its price until its `end_date` (`host/hosting-overview.mdx`: "Changing the price does not change
the rate on any existing rental contract"). A host that raises its price opens a pending price increase on it
(vast-cli `vastai/api/price_increase.py`): the new rates apply from the end_date only if the renter accepts;
otherwise the contract expires then and the instance is stopped (`guides/reference/faq/instances.mdx`).
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vast_harness.sim import transitions
from vast_harness.sim.errors import SimHTTPError
from vast_harness.sim.market import OPERATORS, compare

BYTES_PER_GB = 1_000_000_000
SECONDS_PER_HOUR = 3600.0
LIST_MAX_LIMIT = 25
LIST_NONPOSITIVE_LIMIT = 5  # show_instances.yaml: "Values <= 0 are treated as 5"
MAX_EXEC_TIMES = 1000  # a judge's record of when each command started; more is not kept
# Columns stored on the contract record: filterable (show_instances.yaml); computed ones give 400.
FILTERABLE = frozenset({"id", "label", "actual_status", "intended_status", "cur_state", "next_state",
                        "gpu_name", "verification", "machine_id", "host_id", "image_uuid", "status_msg",
                        "start_date", "end_date", "disk_space", "geolocation", "template_id", "bundle_id"})


# Prices a pending increase changes, with the CLI's row names: per second for GPU and disk (the row's
# `*_costpersec`), $/GB for bandwidth (`new_bwu_cost`, `new_bwd_cost`).
INCREASE_FIELDS = (("gpu_costpersec", "dph_base", SECONDS_PER_HOUR), ("disk_ram_costpersec", "storage_total_cost",
                   SECONDS_PER_HOUR), ("bwu_cost", "inet_up_cost", 1.0), ("bwd_cost", "inet_down_cost", 1.0))


@dataclass
class PriceIncrease:
    """A host's raise on a running contract, pending the renter's answer (GET /instances/pending-price-increases/)."""

    id: int
    factor: float
    old: dict[str, float]  # the contract's prices when it was opened, by `INCREASE_FIELDS` row name
    ask_end_date: float  # the contract's end once extended at the new price
    created_at: float
    accepted: bool = False

    def row(self, inst: Instance) -> dict[str, Any]:
        """The row as the official CLI's `list_pending` documents it."""
        out: dict[str, Any] = {"pending_price_increase_id": self.id, "contract_id": inst.id,
                               "host_id": inst.offer.get("host_id"), "contract_end_date": inst.end_date,
                               "ask_end_date": self.ask_end_date, "created_at": self.created_at,
                               "old_platform_fee": None, "new_platform_fee": None}
        for name, _, _ in INCREASE_FIELDS:
            out[f"old_{name}"] = self.old[name]
            out[f"new_{name}"] = self.old[name] * self.factor
        return out


@dataclass
class Instance:
    id: int
    account: int
    offer: dict[str, Any]  # the priced offer snapshot at create (disk size applied)
    label: str | None
    image: str
    disk_gb: float
    onstart: str
    extra_env: list[list[str]]
    runtype: str
    api_key: str
    jupyter_token: str
    created_at: float
    is_bid: bool
    status_override: str | None = None  # stopped / offline: off the boot path
    booted_at: float | None = None
    never_boots: bool = False
    read_lag_until: float = 0.0
    destroyed_at: float | None = None
    destroyed_by: str | None = None  # "api" (a DELETE) or "vast" (the account's balance past its grace)
    linger_until: float = 0.0  # reads keep showing a destroyed row until then
    boot_error: str | None = None  # status_msg of a container that could not start (status `created`)
    error_status: bool = False  # the error_status fault: reads `actual_status: "error"`, never runs
    keys_reset: bool = False  # the key_reset fault fired: onstart-appended keys no longer authorize
    unreachable: bool = False  # sold twice: reads say running, SSH never accepts, onstart never runs
    container_key_refused: bool = False  # its CONTAINER_API_KEY answers 401 everywhere
    gpu_lie: bool = False  # its nvidia-smi reports another GPU than the offer's (fault gpu_mismatch)
    execs: int = 0  # commands run over SSH (a judge's count: no command text, which may carry settings)
    exec_times: list[float] = field(default_factory=list)  # when each started (the first MAX_EXEC_TIMES)
    receipt_faults: dict[str, float] = field(default_factory=dict)  # what its `vh-receipt` lies about (faults)
    receipt_report: Path | None = None  # where its `vh-receipt` leaves a copy of its answer (sim/host_receipt.py)
    receipt_seed: int = 0  # its receipt's noise, drawn from the simulator's seeded RNG at create
    scheduling_s: float = 0.0  # extra seconds in `scheduling` before the boot path starts
    started_earlier_s: float = 0.0  # the row's start_date is this much older than the create (fault)
    end_date: float = 0.0  # the contract's end (epoch): its price holds until then, and the instance stops then
    increase: PriceIncrease | None = None  # a host's raise, pending the renter's answer (or accepted)
    expired: bool = False  # the contract reached its end_date unextended: stopped, storage bills
    outbid: bool = False  # paused by a higher bid (the bid book): stopped, storage bills, resumes by itself
    outbids: int = 0  # times it was paused so far
    resumes: int = 0  # times it resumed by itself
    copies: int = 0  # copies asked off it (PUT /commands/rsync/)
    user_stopped: bool = False  # stopped by its renter (PUT /instances/{id}/ state stopped)
    ssh_keys: list[dict[str, Any]] = field(default_factory=list)
    direct_port: int = 0
    proxy_port: int = 0
    bytes_to_host: int = 0
    bytes_from_host: int = 0
    bandwidth_usd: float = 0.0
    settled_usd: float = 0.0
    settled_at: float = 0.0
    host: Any = None  # SshHost
    sandbox: Any = None  # Sandbox
    timers: list[threading.Timer] = field(default_factory=list)

    @property
    def live(self) -> bool:
        return self.destroyed_at is None

    def lingering(self, now: float) -> bool:
        return not self.live and now < self.linger_until

    def actual_status(self, now: float, boot_s: float) -> str | None:
        if not self.live:
            return transitions.DESTROYED
        if self.boot_error is not None:
            return transitions.ERROR if self.error_status else transitions.CREATED
        if self.status_override is not None:
            return self.status_override
        if self.booted_at is not None:
            return transitions.RUNNING
        if now - self.created_at < self.scheduling_s:
            return transitions.STOPPED  # waiting for its GPU: stopped, intended running (see `scheduling_now`)
        return transitions.pending_status(now - self.created_at - self.scheduling_s, boot_s)

    def scheduling_now(self, now: float) -> bool:
        return (self.live and self.status_override is None and self.booted_at is None and self.boot_error is None
                and now - self.created_at < self.scheduling_s)

    def rate_usd_per_h(self) -> float:
        if not self.live or self.status_override in transitions.UNBILLED_STATUSES:
            return 0.0
        if self.status_override in transitions.STORAGE_ONLY_STATUSES or self.booted_at is None:
            return float(self.offer["storage_total_cost"])  # GPU bills from running, not while pending
        return float(self.offer["dph_total"])

    def settle(self, now: float) -> None:
        """Fold the accrual so far into settled_usd; call before anything changes the rate."""
        self.settled_usd += max(0.0, now - self.settled_at) * self.rate_usd_per_h() / SECONDS_PER_HOUR
        self.settled_at = now

    def billed_usd(self, now: float) -> float:
        accrued = max(0.0, now - self.settled_at) * self.rate_usd_per_h() / SECONDS_PER_HOUR
        return self.settled_usd + accrued + self.bandwidth_usd

    def add_bandwidth(self, to_host: int, from_host: int) -> None:
        self.bytes_to_host += to_host
        self.bytes_from_host += from_host
        self.bandwidth_usd += (to_host * self.offer["inet_down_cost"]
                               + from_host * self.offer["inet_up_cost"]) / BYTES_PER_GB

    def record(self, now: float, boot_s: float) -> dict[str, Any]:
        """The /_sim/state view: everything but secrets (no keys of any kind)."""
        end = self.destroyed_at if self.destroyed_at is not None else now
        return {
            "id": self.id, "label": self.label, "offer_id": self.offer["id"],
            "machine_id": self.offer["machine_id"], "account": self.account, "live": self.live,
            "actual_status": self.actual_status(now, boot_s), "created_at": self.created_at,
            "booted_at": self.booted_at, "destroyed_at": self.destroyed_at, "destroyed_by": self.destroyed_by,
            "billed_seconds": end - self.created_at, "billed_usd": self.billed_usd(now),
            "dph_total": self.offer["dph_total"], "disk_gb": self.disk_gb,
            "bytes_to_host": self.bytes_to_host, "bytes_from_host": self.bytes_from_host,
            "bandwidth_usd": self.bandwidth_usd, "direct_port": self.direct_port,
            "proxy_port": self.proxy_port, "gpu_lie": self.gpu_lie, "execs": self.execs,
            "exec_times": list(self.exec_times), "receipt_faults": dict(self.receipt_faults),
            "offer_figures": {k: self.offer.get(k) for k in ("gpu_name", "num_gpus", "pcie_bw", "pci_gen",
                                                             "gpu_mem_bw", "total_flops", "bw_nvlink")},
            "receipt": self.receipt_answer(),
            "end_date": self.end_date, "expired": self.expired, "is_bid": self.is_bid, "outbid": self.outbid,
            "outbids": self.outbids, "resumes": self.resumes, "copies": self.copies,
            "price_increase": None if self.increase is None else {"id": self.increase.id, "factor": self.increase.factor,
                                                                  "accepted": self.increase.accepted},
            "live_pids": self.sandbox.live_pids() if self.sandbox is not None else [],
        }


    def receipt_answer(self) -> Any:
        """The receipt its `vh-receipt` gave, as it gave it (None: none yet, or unreadable)."""
        if self.receipt_report is None:
            return None
        try:
            return json.loads(self.receipt_report.read_text())
        except (OSError, ValueError):
            return None


def render(inst: Instance, now: float, boot_s: float) -> dict[str, Any]:
    """The instance as Vast's show/list endpoints return it (show_instances.yaml field names)."""
    offer = inst.offer
    status = inst.actual_status(now, boot_s)
    running = status == transitions.RUNNING
    out: dict[str, Any] = {key: offer.get(key) for key in _OFFER_COPIED}
    if out["cpu_cores"] is None:  # unreported by the host; the instance schema has no null for it
        del out["cpu_cores"]
    out.update(transitions.contract_states(status, scheduling=inst.scheduling_now(now)))
    out.update(
        id=inst.id, actual_status=status, label=inst.label, template_id=None, template_hash_id=None,
        template_name=None, image_uuid=inst.image, image_args=[], image_runtype=inst.runtype,
        extra_env=inst.extra_env, onstart=inst.onstart, jupyter_token=inst.jupyter_token,
        status_msg=_status_msg(inst, status), public_ipaddr="127.0.0.1\n", local_ipaddrs="127.0.0.1 \n",
        ssh_host="127.0.0.1", ssh_idx="1", ssh_port=inst.proxy_port, machine_dir_ssh_port=inst.proxy_port,
        ports={"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(inst.direct_port)}]} if running else None,
        direct_port_start=inst.direct_port, direct_port_end=inst.direct_port,
        start_date=inst.created_at - inst.started_earlier_s, end_date=inst.end_date, duration=inst.end_date - now,
        uptime_mins=(now - inst.booted_at) / 60 if running and inst.booted_at else None,
        disk_space=inst.disk_gb, disk_util=0.0, disk_usage=0.0, cpu_util=0.0, mem_limit=None,
        mem_usage=None, vmem_usage=None, gpu_util=None, gpu_temp=None, gpu_totalram=offer["gpu_total_ram"],
        rentable=True, credit_balance=None, credit_discount=None, client_run_time=(now - inst.created_at)
        / SECONDS_PER_HOUR, host_run_time=1.0, country_code=offer["geolocation"].rsplit(", ", 1)[-1],
        volume_info=[], is_bid=inst.is_bid,
    )
    return out


_OFFER_COPIED = (
    "machine_id", "bundle_id", "host_id", "gpu_name", "gpu_arch", "gpu_ram", "gpu_frac", "gpu_lanes",
    "gpu_mem_bw", "bw_nvlink", "num_gpus", "compute_cap", "cuda_max_good", "driver_version", "cpu_arch",
    "cpu_cores", "cpu_cores_effective", "cpu_name", "cpu_ram", "disk_name", "disk_bw", "direct_port_count",
    "static_ip", "geolocation", "verification", "hosting_type", "min_bid", "dph_base", "dph_total",
    "dlperf", "dlperf_per_dphtotal", "flops_per_dphtotal", "total_flops", "score", "reliability2",
    "os_version", "mobo_name", "pci_gen", "pcie_bw", "logo", "webpage", "search", "instance",
    "storage_cost", "storage_total_cost", "vram_costperhour", "credit_discount_max", "external",
    "time_remaining", "time_remaining_isbid", "inet_up_cost", "inet_down_cost",
)


def _status_msg(inst: Instance, status: str | None) -> str | None:
    if status == transitions.CREATED:
        return inst.boot_error
    if status == transitions.EXITED:
        return "Exited (1) container process ended"
    if status == transitions.DESTROYED:
        return None
    if status == transitions.RUNNING:
        return f"success, running {inst.image.replace(':', '_')}/ssh"
    if status == transitions.LOADING:
        return f"Pulling image {inst.image}"
    if status == transitions.ERROR:
        return inst.boot_error
    if status == transitions.STOPPED and inst.scheduling_now(time.time()):
        return "Scheduling: waiting for the GPU to be available"
    if status == transitions.STOPPED and inst.user_stopped:
        return "Instance stopped by the user"
    if status == transitions.STOPPED and inst.outbid:
        return "Instance paused: outbid; it resumes when its bid regains priority"
    if status == transitions.STOPPED and inst.expired:
        return "Instance stopped: its rental contract expired (end date reached)"
    if status == transitions.STOPPED:
        return "Instance stopped: bid below the minimum or host unavailable"
    if status == transitions.OFFLINE:
        return "host offline: no heartbeat"
    return None


def _bad_query(msg: str, code: str = "invalid_request") -> SimHTTPError:
    return SimHTTPError(400, {"error": code, "msg": msg})


def _json_param(params: dict[str, str], name: str, default: Any) -> Any:
    if name not in params:
        return default
    try:
        return json.loads(params[name])
    except json.JSONDecodeError:
        raise _bad_query(f"Error in query parameters: {name} is not valid JSON") from None


def parse_limit(raw: str | None) -> int:
    if raw is None:
        return LIST_MAX_LIMIT
    try:
        limit = int(raw)
    except ValueError:
        raise _bad_query(f"Error in query parameters: limit must be an integer, got {raw!r}") from None
    return LIST_NONPOSITIVE_LIMIT if limit <= 0 else min(limit, LIST_MAX_LIMIT)


def _filters(params: dict[str, str]) -> list[tuple[str, str, Any]]:
    raw = _json_param(params, "select_filters", {})
    if not isinstance(raw, dict):
        raise _bad_query("Error in query parameters: select_filters must be a JSON object")
    triples = []
    for col, cond in raw.items():
        if col not in FILTERABLE:
            raise _bad_query(f"Error in query parameters: {col} is not a valid search key")
        if not isinstance(cond, dict):
            cond = {"eq": cond}
        for op, value in cond.items():
            if op not in OPERATORS or (op in ("in", "notin") and not isinstance(value, list)):
                raise _bad_query(f"Error in query parameters: bad operator {op!r} on {col}")
            triples.append((col, op, value))
    return triples


def _order(params: dict[str, str]) -> list[tuple[str, bool]]:
    raw = _json_param(params, "order_by", [{"col": "id", "dir": "asc"}])
    if not isinstance(raw, list) or not all(isinstance(d, dict) and "col" in d for d in raw):
        raise _bad_query('Error in query parameters: order_by must be like [{"col":"id","dir":"asc"}]')
    order = []
    for directive in raw:
        if directive["col"] not in FILTERABLE:
            raise _bad_query(f"Error in query parameters: cannot order by {directive['col']}")
        order.append((directive["col"], str(directive.get("dir", "asc")).lower() == "desc"))
    if not any(col == "id" for col, _ in order):
        order.append(("id", False))  # the documented tiebreaker; also makes the keyset unique
    return order


def _after(row: dict[str, Any], mark: dict[str, Any], order: list[tuple[str, bool]]) -> bool:
    """True when `row` sorts strictly after the token's values (nulls last)."""
    for col, desc in order:
        a, b = row.get(col), mark.get(col)
        if a == b:
            continue
        if a is None or b is None:
            return a is None
        return bool((a > b) != desc)
    return False


def _decode_token(token: str) -> dict[str, Any]:
    try:
        values = json.loads(base64.urlsafe_b64decode(token.encode()))["values"]
    except (binascii.Error, ValueError, KeyError, TypeError):
        raise _bad_query("Invalid after_token", "invalid_token") from None
    if not isinstance(values, dict) or "id" not in values:
        raise _bad_query("Invalid after_token", "invalid_token")
    return values


def list_page(rows: list[dict[str, Any]], params: dict[str, str]) -> dict[str, Any]:
    """One page of GET /api/v1/instances/ over rendered rows (the caller's live instances)."""
    limit = parse_limit(params.get("limit"))
    triples, order = _filters(params), _order(params)
    cols = _json_param(params, "select_cols", ["*"])
    matched = [r for r in rows if all(compare(r.get(c), op, v) for c, op, v in triples)]
    for col, desc in reversed(order):
        present = sorted((r for r in matched if r.get(col) is not None), key=lambda r: r[col], reverse=desc)
        matched = present + [r for r in matched if r.get(col) is None]
    if params.get("after_token"):
        mark = _decode_token(params["after_token"])
        matched_after = [r for r in matched if _after(r, mark, order)]
    else:
        matched_after = matched
    page = matched_after[:limit]
    next_token = None
    if len(matched_after) > limit:
        values = {col: page[-1].get(col) for col, _ in order}
        next_token = base64.urlsafe_b64encode(json.dumps({"values": values}).encode()).decode()
    if isinstance(cols, list) and "*" not in cols:
        page = [{c: r.get(c) for c in cols} for r in page]
    label_counts: dict[str, int] = {}
    for row in matched:
        label_counts[row.get("label") or ""] = label_counts.get(row.get("label") or "", 0) + 1
    return {"success": True, "instances_found": len(page), "total_instances": len(matched),
            "label_counts": label_counts, "next_token": next_token, "instances": page}
