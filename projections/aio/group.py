"""Several instances of one projection, one per slice range, that can be rescaled.

Rescaling stops every instance (each finishes its in-flight batch and saves
its offsets), then starts instances for the new ranges. Because offsets are
stored per slice and a range resumes from the earliest of its slices' latest
offsets, going 4 → 8 → 2 → 1 loses nothing and applies nothing twice.
Instances run as tasks here and as threads in the generated sync group.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from journal.aio.flavour import Task, gather, spawn, task_failure
from journal.slices import SliceRange, slice_ranges
from projections.aio.runner import Projection, check_pools
from projections.core import ProjectionStats

_log = logging.getLogger("slicejournal.projections.scaling")


class ProjectionGroup:
    """Runs `factory(range)` for each range of `slice_ranges(instances)`."""

    def __init__(self, factory: Callable[[SliceRange], Projection], instances: int = 4) -> None:
        slice_ranges(instances)  # validates
        self._factory = factory
        self._instances = instances
        self.projections: list[Projection] = []
        self._tasks: list[Task[None]] = []
        self.finished: list[ProjectionStats] = []

    @property
    def instances(self) -> int:
        """How many instances (slice ranges) the group runs."""
        return self._instances

    async def start(self) -> None:
        """Start one instance per range (no-op if running).

        The journals' idle pooled connections are tested first, as a fleet worker
        does after a failure: a group restarted after a connection failure (backends
        terminated, a server restarted) starts on fresh connections, not stale ones."""
        if self._tasks:
            return
        self.projections = [self._factory(r) for r in slice_ranges(self._instances)]
        for journal in {id(p.journal): p.journal for p in self.projections}.values():
            await check_pools(journal)
        self._tasks = [spawn(self._run, p, name=f"projection {p.key}") for p in self.projections]

    @staticmethod
    async def _run(projection: Projection) -> None:
        await projection.run()

    async def stop(self) -> None:
        """Stop every instance after its in-flight batch.

        Raises the first instance failure (a `ProjectionError` when a handler
        kept failing); every failure is logged with its projection and range.
        """
        for p in self.projections:
            await p.stop()
        results = await gather(self._tasks)
        self.finished.extend(p.stats for p in self.projections)
        self._tasks, self.projections = [], []
        # Each failure was logged by its instance (projection, range, error).
        failure = next((r for r in results if isinstance(r, Exception)), None)
        if failure is not None:
            raise failure

    async def rescale(self, instances: int) -> None:
        """Stop all instances and start `instances` new ones over the new ranges."""
        slice_ranges(instances)
        before = self._instances
        await self.stop()
        self._instances = instances
        await self.start()
        name = self.projections[0].name if self.projections else "?"
        fields = {"projection": name, "event": "rescaled", "instances": instances}
        _log.info("projection %s rescaled from %d to %d instances", name, before, instances,
                  extra=fields)  # fmt: skip

    def failed(self) -> BaseException | None:
        """The first failure among running instances, if any."""
        for t in self._tasks:
            failure = task_failure(t)
            if failure is not None:
                return failure
        return None

    def stats(self) -> list[ProjectionStats]:
        """Counters of every instance this group ran (stopped ones first)."""
        return [*self.finished, *(p.stats for p in self.projections)]

    async def __aenter__(self) -> ProjectionGroup:
        await self.start()
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc is None:
            await self.stop()  # an instance's failure surfaces here
            return
        # The block itself failed: that error wins, but an instance failure is still logged.
        try:
            await self.stop()
        except Exception as failure:
            _log.error("while leaving the group after %r: %s", exc, failure)
