"""Priorities: the order component that ranks requests by a number their sender gives them.

vLLM's ``--scheduling-policy priority``: each request carries an integer
``priority`` (default 0), and the smaller number goes first. Among equal
priorities the order is first-come-first-served. So:

* the first waiting (or swapped) request to start is the oldest of the
  smallest priority that queue holds, however many older requests of larger
  priorities wait before it;
* the victim, when blocks run out, is the newest request of the largest
  priority running;
* swapped requests keep a waiting one out only if one of them has a priority as
  small as its own or smaller (FCFS: anybody swapped out keeps everyone waiting);
* the running groups leave the first waiting request its sequence slots when
  its priority is smaller than a running request's.

A waiting request does not take blocks from running ones: it starts once the free
blocks hold its first chunk, as under FCFS (a request of larger priority that
runs out of room is evicted before it, by the rule above). With every priority
equal every rank compares as FCFS does, so every plan is the same as under
``FirstComeFirstServed`` (``tests/step05_preemption``).
"""

from __future__ import annotations

from collections import Counter

from paged.step03_attention.request import Request


# --8<-- [start:priority]
class PriorityFirst:
    """Order: the smallest ``priority`` first (vLLM's); within a priority, FCFS."""

    ranks_priority = True  # the engine accepts priorities other than 0 (Engine.check_request)

    def __init__(self) -> None:
        # queue name -> priority -> how many requests of that priority the queue holds
        self.counts: dict[str, Counter] = {"waiting": Counter(), "running": Counter(), "swapped": Counter()}

    def rank(self, req: Request) -> tuple[int, int]:
        return req.priority, req.arrival

    def first(self, queue) -> Request:
        """The oldest request of the smallest priority in ``queue`` (kept in arrival order)."""
        best = min(self.counts[queue[0].queue])
        return next(req for req in queue if req.priority == best)

    def waits(self, req: Request, swapped) -> bool:
        """Swapped requests come back first when one has a priority as small as ``req``'s or smaller."""
        return any(priority <= req.priority for priority in self.counts["swapped"])

    def held_seqs(self, waiting) -> int:
        """Slots for the first waiting request when its priority is smaller than a running one's: else
        requests of larger priority holding every ``max_num_seqs`` slot would keep it waiting."""
        running = self.counts["running"]
        if not waiting or not running:
            return 0
        req = self.first(waiting)
        return len(req.live_seqs) if req.priority < max(running) else 0

    def moved(self, req: Request, old: str | None, new: str | None) -> None:
        for queue, step in ((old, -1), (new, 1)):
            if queue is not None:
                counts = self.counts[queue]
                counts[req.priority] += step
                if counts[req.priority] == 0:
                    del counts[req.priority]  # only the priorities a queue holds now
# --8<-- [end:priority]
