"""This router's leases of each backend's slots, from the app's slot broker (several routers
with `gateway.shared_slots`: policy/slot_leases.py says how the slots move).

Every POST_S (HURRY_S while users wait at some router) the router posts, per backend, the
slots it admits under, what it runs and what waits in its queue by class, and runs under the
leases the broker answers (a raised lease admits waiters at once; a lowered one admits nobody
new until what runs fits under it). With preemption on it posts its work by class too, and
hears every router's: preemption weighs the backend's batch (link.others_at_work).
Admission itself never calls the broker. Cut off from it for FALLBACK_AFTER_S, the router goes
back to an equal share of each cap, which the broker holds for it from slot_broker.SILENT_AFTER_S
on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from core.clock import Clock
from deployments.router import metrics
from deployments.router.adapters.ports import SlotSource
from deployments.router.request_path.link import Link
from policy.slot_leases import SlotReport

logger = logging.getLogger("ray.serve")

POST_S = 0.1
HURRY_S = 0.02  # while users wait at some router: slots move to them in a few of these
POST_TIMEOUT_S = 1.0
FALLBACK_AFTER_S = 3.0


class SlotSync:
    def __init__(self, links: Mapping[str, Link], source: SlotSource | None, clock: Clock) -> None:
        self._links = links
        self._source = source
        self._clock = clock
        self._last_ok = clock.monotonic()
        self._failing = False
        self._hurry = False

    @property
    def follows(self) -> bool:
        return self._source is not None

    async def loop(self) -> None:
        while True:
            await self.step()
            await self._clock.sleep(HURRY_S if self._hurry else POST_S)

    async def step(self) -> None:
        """One post; a failed one keeps the leases, until the broker has been out of reach
        for FALLBACK_AFTER_S."""
        try:
            await self.post_once()
        except Exception as error:  # noqa: BLE001 - the broker restarting: keep the leases a while
            self._hurry = False
            self._cut_off(error)

    async def post_once(self) -> None:
        """Post and run under the leases answered; where one shrank, or where this router was
        asked to pause some of its work, post again at once: the broker frees the slots given up
        only once this router reports running under less, and the other routers reckon their
        pauses without the ones this router's next post would show only 0.1 s later."""
        if await self._post():
            await self._post()

    async def _post(self) -> bool:
        """One post; whether to post again (a lease shrank, or pauses were asked)."""
        source = self._source
        if source is None:
            return False
        reports = {
            name: SlotReport(
                link.gate.queue.cap,
                link.gate.queue.in_flight,
                link.gate.queue.depth_by_class(),
                link.total_cap,
                link.work(),
            )
            for name, link in list(self._links.items())
        }
        answer = await asyncio.wait_for(source.post(reports), POST_TIMEOUT_S)
        self._hurry = answer.hurry
        shrank = False
        for name, lease in answer.leases.items():
            link = self._links.get(name)
            if link is not None:
                before = link.gate.queue.cap
                link.leased(lease)
                shrank |= link.gate.queue.cap < before
        asked = 0
        for name, link in list(self._links.items()):
            asked += link.others_at_work(answer.work.get(name, {}), answer.me)
        self._last_ok = self._clock.monotonic()
        if self._failing:
            logger.warning("slot broker reachable again: leases from it")
            self._failing = False
        return shrank or asked > 0

    def _cut_off(self, error: BaseException) -> None:
        metrics.LOOP_ERRORS.labels("slot_sync").inc()
        if self._failing or self._clock.monotonic() - self._last_ok < FALLBACK_AFTER_S:
            return
        self._failing = True
        logger.warning("slot broker not reachable (%r): back to an equal share of each cap", error)
        for link in list(self._links.values()):
            link.leased(None)
            link.others_at_work({}, "")  # the others' last work would hold lower classes here
