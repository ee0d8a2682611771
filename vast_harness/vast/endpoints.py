"""Where the control plane spells Vast's URLs: one path per endpoint method, as data (a leaf module).

The client (`client.py`) calls these, the pacing (`pacing.py`) keys its rate rules on them, and the onstart's
dead-man switch (`onstart.py`) deletes and reads its own instance through `instance`. A path's `{id}` is the
pacing key's placeholder. GET and DELETE of an instance share one path; the pacing keys each operation apart.
"""

from __future__ import annotations

INSTANCE = "/api/v0/instances/{id}/"  # per-id read and DELETE: the v0 family Vast is retiring (see the docs)
V1_INSTANCES = "/api/v1/instances/"

ENDPOINT_PATHS = {
    "search_offers": "/api/v0/bundles/",
    "create_instance": "/api/v0/asks/{id}/",
    "get_instance": INSTANCE,
    "read_instance_raw": INSTANCE,
    "destroy_instance": INSTANCE,
    "list_instances": V1_INSTANCES,
    "list_instances_page": V1_INSTANCES,
    "list_instances_raw": V1_INSTANCES,
    "current_user": "/api/v0/users/current/",
    "attach_ssh_key": "/api/v0/instances/{id}/ssh/",  # attach_ssh.yaml: a key Vast keeps in the instance's set
    # a host's raises on the account's running contracts (vast-cli vastai/api/price_increase.py); read, never answered
    "pending_price_increases": "/api/v0/instances/pending-price-increases/",
    # a copy with one side local, as `vastai copy` sends it (vast-cli vastai/api/storage.py::copy): the answer
    # names where rsync connects; it works on a stopped instance (data-movement.mdx)
    "copy_to_local": "/api/v0/commands/rsync/",
    # stop or start an instance (manage_instance.yaml, `vastai stop|start instance`): the interruptible canary
    # stops its own bid instance to see what a paused one shows and copy off it
    "set_instance_state": INSTANCE,
}
# The collection Vast already retired (410 deprecated_endpoint: skypilot issue 10517); `check` asks it only to
# see that it still says so, never for data.
LEGACY_V0_LIST = "/api/v0/instances/"
