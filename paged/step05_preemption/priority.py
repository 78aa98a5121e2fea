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

The order keeps each queue's requests again, by priority, each priority's list in
arrival order (``moved``): the first of a queue is the head of its smallest
priority's list, found without a scan of the queue however long it is.
"""

from __future__ import annotations

import bisect

from paged.step03_attention.request import Request


# --8<-- [start:priority]
class PriorityFirst:
    """Order: the smallest ``priority`` first (vLLM's); within a priority, FCFS."""

    ranks_priority = True  # the engine accepts priorities other than 0 (Engine.check_request)

    def __init__(self) -> None:
        # queue name -> priority -> the queue's requests of that priority, in arrival order
        self.lists: dict[str, dict[int, list[Request]]] = {"waiting": {}, "running": {}, "swapped": {}}

    def rank(self, req: Request) -> tuple[int, int]:
        return req.priority, req.arrival

    def first(self, queue) -> Request:
        """The oldest request of the smallest priority in ``queue``: the head of that priority's list."""
        lists = self.lists[queue[0].queue]
        return lists[min(lists)][0]

    def waits(self, req: Request, swapped) -> bool:
        """Swapped requests come back first when one has a priority as small as ``req``'s or smaller."""
        return any(priority <= req.priority for priority in self.lists["swapped"])

    def held_seqs(self, waiting) -> int:
        """Slots for the first waiting request when its priority is smaller than a running one's: else
        requests of larger priority holding every ``max_num_seqs`` slot would keep it waiting."""
        running = self.lists["running"]
        if not waiting or not running:
            return 0
        req = self.first(waiting)
        return len(req.live_seqs) if req.priority < max(running) else 0

    def moved(self, req: Request, old: str | None, new: str | None) -> None:
        if old is not None:
            same = self.lists[old][req.priority]
            same.pop(bisect.bisect_left(same, req.arrival, key=arrival))
            if not same:
                del self.lists[old][req.priority]  # only the priorities a queue holds now
        if new is not None:
            bisect.insort(self.lists[new].setdefault(req.priority, []), req, key=arrival)


def arrival(req: Request) -> int:
    return req.arrival
# --8<-- [end:priority]
