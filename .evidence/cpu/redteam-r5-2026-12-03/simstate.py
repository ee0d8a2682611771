"""Print the simulator's record of each instance whose label contains ARG: `simstate.py PORT [LABEL_PART]`."""

import json
import sys
import urllib.request

port = sys.argv[1]
part = sys.argv[2] if len(sys.argv) > 2 else ""
with urllib.request.urlopen(f"http://127.0.0.1:{port}/_sim/state") as answer:
    state = json.load(answer)
keys = ("id", "label", "live", "actual_status", "destroyed_by", "billed_seconds", "billed_usd", "created_at",
        "destroyed_at", "live_pids")
for inst in state["instances"]:
    if part in inst["label"]:
        print({k: inst[k] for k in keys})
print("server_errors", state.get("server_errors"))
