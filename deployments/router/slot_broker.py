"""The app's slot broker: one detached actor that keeps the books of every router's slots
(policy/slot_leases.py decides) and hands each router its leases as it posts.

Routers post a few times a second (deployments/router/loops/slot_sync.py); nothing on a request's
path calls here. A router not heard from for SILENT_AFTER_S is held at its fallback share (it
falls back to it itself after slot_sync.FALLBACK_AFTER_S, later); one both silent and without
a Serve replica frees its slots. After a (re)start the broker has no books: for WARM_UP_S it
grants no router more than it reports running under, until every router alive has posted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from core.types import PriorityClass
from deployments.detached import gateway_actor, stop_older_protocols
from policy.preemption import RouterWork
from policy.slot_leases import SlotLedger, SlotReport

logger = logging.getLogger("ray.serve")

SILENT_AFTER_S = 1.0
WARM_UP_S = 1.5
WATCH_S = 0.5
GONE_CHECK_S = 5.0
ROUTER_DEPLOYMENTS = ("ingress", "router")  # whichever runs the routers

# On the wire: {backend: [lease, in_flight, {class: waiting}, total, work]} ->
# {"leases": {backend: [slots, of]}, "hurry": bool, "work": {backend: {router: work}}, "me": id},
# where work is [{class: running}, {class: pausable}, pausing] (None from an older router).
Posted = Mapping[str, list[Any]]
WireWork = list[Any]
# A router's work counts for the others while its posts are this fresh (it posts every 0.1 s).
WORK_FRESH_S = 1.0


def work_to_wire(work: RouterWork) -> WireWork:
    return [{c.value: n for c, n in work.running.items()},
            {c.value: n for c, n in work.pausable.items()}, work.pausing]  # fmt: skip


def work_from_wire(wire: WireWork) -> RouterWork:
    running, pausable, pausing = wire
    return RouterWork(
        {PriorityClass(c): int(n) for c, n in running.items()},
        {PriorityClass(c): int(n) for c, n in pausable.items()},
        int(pausing),
    )


# The posts' protocol, in the broker's name: a detached broker of an older one outlives an
# upgrade of the app and would read the new posts wrong. 2: posts carry each router's work.
PROTOCOL = 2


def broker_name(app: str, protocol: int = PROTOCOL) -> str:
    return f"gps_slot_broker::{app}" if protocol == 1 else f"gps_slot_broker::v{protocol}::{app}"


class SlotBroker:
    def __init__(self, app: str, routers: int) -> None:
        self._app = app
        self._ledger = SlotLedger(routers)
        self._heard: dict[str, float] = {}
        self._started = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    async def post(self, router: str, routers: int, posted: Posted) -> dict[str, Any]:
        """`router`'s post (one of `routers` sharing each cap): its leases, and whether users
        wait somewhere (`hurry`)."""
        self._ledger.routers = routers  # a redeploy of the app may run another number
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch())
        now = time.monotonic()
        self._heard[router] = now
        reports = {
            backend: SlotReport(
                int(lease), int(in_flight), {PriorityClass(c): int(n) for c, n in waiting.items()},
                int(total), work_from_wire(work[0]) if work and work[0] is not None else None,
            )
            for backend, (lease, in_flight, waiting, total, *work) in posted.items()
        }  # fmt: skip
        leases = self._ledger.post(router, reports, now)
        warming = now - self._started < WARM_UP_S
        granted = {
            backend: [min(lease.slots, reports[backend].lease) if warming else lease.slots,
                      lease.of_total]
            for backend, lease in leases.items()
        }  # fmt: skip
        work = {
            backend: {r: work_to_wire(w) for r, w in by_router.items()}
            for backend, by_router in self._ledger.work_for(reports, now, WORK_FRESH_S).items()
        }
        return {"leases": granted, "hurry": self._ledger.users_waiting(), "work": work,
                "me": router}  # fmt: skip

    def stats(self) -> dict[str, Any]:
        """Slot-seconds users waited at one router while another held an unused slot, and
        all the seconds users waited, per backend (the broker's view, at its posts' pace)."""
        ledger = self._ledger
        return {
            "idle_while_user_waits_s": dict(ledger.idle_while_user_waits),
            "user_wait_s": dict(ledger.user_wait_seconds),
            "routers": sorted(self._heard),
        }

    async def _watch(self) -> None:
        checked = time.monotonic()
        while True:
            try:
                now = time.monotonic()
                for router, heard in self._heard.items():
                    if now - heard > SILENT_AFTER_S:
                        self._ledger.silent(router)
                if now - checked > GONE_CHECK_S:
                    checked = now
                    await self.prune()
            except Exception:  # the books must outlive one failed check
                logger.exception("slot broker: watching the routers failed")
            await asyncio.sleep(WATCH_S)

    async def prune(self) -> None:
        """Free the slots of routers gone: silent, and without a Serve replica."""
        from deployments.live_config import replica_ids

        alive = await asyncio.to_thread(replica_ids, self._app, ROUTER_DEPLOYMENTS)
        # Silent as well: a router posting now is alive, whatever a (busy GCS's) list says.
        now = time.monotonic()
        silent = {r for r, heard in self._heard.items() if now - heard > SILENT_AFTER_S}
        gone = (self._ledger.routers_known() - alive) & silent
        if gone:
            self._ledger.forget(gone)
            for router in gone:
                self._heard.pop(router, None)
            logger.info("slot broker: routers gone, their slots freed: %s", sorted(gone))


def ensure_slot_broker(
    app: str, namespace: str, resources: Mapping[str, float], routers: int
) -> Any:
    """The app's broker, started by the first router to need it, on the gateway's nodes; one of
    an older protocol is stopped (routers still posting to it fall back to an equal share)."""
    stop_older_protocols(lambda n: broker_name(app, n), PROTOCOL, namespace)
    return gateway_actor(SlotBroker, broker_name(app), namespace, resources, app, routers)
