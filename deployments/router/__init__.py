"""The Router deployment: admission, breakers and failover between the ingress and the engines.

For each job it walks its model's failover chain (`request_path/flow.py`): the first link that
is running, whose breaker lets work through and whose KV cache is not under pressure. There the
job waits for a slot in the backend's priority queue (`policy.gate`), is fitted to that
backend's window, and is sent (`request_path/serving.py`). A fault before the first token (a
5xx, a dead replica, no first token in time) is charged to the backend's breaker and the job
moves to the next link, fitted again; after the first token the answer goes on on the next link
where it can, else the stream ends with an SSE error event. Background loops keep the view fresh
(`loops/watch.py`): Serve's replica status with health probes for troubled links, each engine's
KV-cache usage and counts. A link is also out at once while its Serve handle holds no replica
(`adapters/handle_replicas.py`: the controller pushes the running set to every handle), so no
job waits in a handle for a replacement to start. A link's state is derived from what was
recorded about it (`policy.links`).

State is in memory. With several routers (`gateway.router_replicas`, or ingress replicas that
each run one) the slots of each backend are one set for all: each router admits under a lease
the app's slot broker moves to where users wait (policy/slot_leases.py), the sum never past the
cap (`loops/slot_sync.py`; `gateway.shared_slots: false`, or the broker out of reach: `cap //
routers` each). Where each model serves now every replica pulls from the placement actor
(`loops/placement_sync.py`), so all of them follow each move, and one that starts late or
restarts routes by it at once; which pools are down, from the cluster manager
(`loops/pool_sync.py`): their links take no new work.

Everything outside (backends, Serve's status, the placement actor, tokenizers, the clock) comes
in through `adapters/ports.RouterPorts`; `ServeRouter` is the Router with Serve's own
(`adapters/serve_ports.py`), both in `router.py`.

Four rooms: `request_path/` (a job's way), `loops/` (the view kept fresh), `adapters/` (the
outside world) and, beside `router.py`, the slot broker's actor (`slot_broker.py`), the metrics
and the status report.

Importing the package loads nothing: each module is imported by its own name (the slot broker's
actor imports slot_broker.py alone, not the router).
"""
