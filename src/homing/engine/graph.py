"""The queue graph: keeping it acyclic, and taking queues out of it."""

from __future__ import annotations

from homing.engine import codec, credits, dead_letters, routing
from homing.engine.model import GraphCycle
from homing.engine.run import Run
from homing.store import engine_queries as q


def check_acyclic(edges: list[tuple[str, str]], src: str, dest: str) -> None:
    """Refuse an edge ``src -> dest`` that would close a loop (messages could circle)."""
    if src == dest:
        raise GraphCycle(f"a selector on {src!r} cannot route to {src!r} itself")
    adjacent: dict[str, list[str]] = {}
    for a, b in edges:
        adjacent.setdefault(a, []).append(b)
    seen = {dest}
    stack = [(dest, [dest])]
    while stack:
        node, path = stack.pop()
        for nxt in adjacent.get(node, []):
            if nxt == src:
                loop = " -> ".join([src, *path, src])
                raise GraphCycle(
                    f"routing {src!r} to {dest!r} would close the loop {loop}; messages could "
                    "circle forever. Route elsewhere or unbind a selector of the loop first"
                )
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))


def destroy_queue(run: Run, name: str, *, why: str = "was deleted") -> None:
    """Delete a queue and what it holds: its selectors return their messages; held
    messages are bounced to their return address, or else go to the engine's dead-letter
    queue; selectors of other queues that fed it are deleted (self-destruct cascades);
    queues that used it as their dead-letter queue lose that link."""
    for sel in list(run.selectors(name)):
        credits.remove_selector(run, sel)
    while True:
        batch = q.entries(run.tx, name, state="ready", limit=routing.PUMP_BATCH)
        if not batch:
            break
        for row in batch:
            target = row["return_address"]
            if target and target != name and run.queue(target) is not None:
                routing.arrive(
                    run,
                    codec.from_row(
                        row,
                        queue=target,
                        address=target,
                        return_address=None,
                        original_address=row["original_address"] or row["address"],
                        parent=None,
                        reason=f"queue {name!r} {why}",
                    ),
                    external=False,
                )
                credits.finish(run, row, "bounced")
            else:
                dead_letters.dead_letter(
                    run, row, codec.DEAD_LETTERS, "queue_deleted", f"queue {name!r} {why}"
                )
    feeders = q.selectors_targeting(run.tx, name)
    q.delete_queue(run.tx, name)
    run.forget()
    for sel in feeders:
        credits.remove_selector(run, sel)
        after_selector_removed(run, sel["queue"])


def after_selector_removed(run: Run, queue: str) -> None:
    """A self-destructive queue left without selectors is deleted; others are re-routed."""
    row = run.queue(queue)
    if row is None:
        return
    if row["self_destruct"] and not run.selectors(queue):
        destroy_queue(run, queue)
        return
    if row["expires"] is not None:
        q.touch_queue(run.tx, queue, run.now)  # unused from now on, not since it was made
    run.work.append(("pump-all", queue))
