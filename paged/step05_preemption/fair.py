"""Fair share across clients: the order component for a server that many clients share.

First-come-first-served (step03's ``FirstComeFirstServed``, the paper's
policy) is fair to requests, not to the people who send them. One client that
sends 200 long requests at once fills the KV cache; under memory pressure its
preempted requests go back into the queues at their old places, ahead of any
later arrival, and a newcomer's one-token request waits until all of them are
back on the device — tens of seconds.

``FairShare`` ranks a request by its client first: the fewer requests a client
has running, the sooner its requests go, and the later its requests are
evicted. Within one client the order stays first-come-first-served. So:

* a waiting request of a client with nothing running starts before the
  requests of a client that holds the device, however early those arrived;
* the victim, when blocks run out, is the newest request of the client with
  the most running;
* swapped requests keep a waiting one out only if their client has no more
  running than the waiting one's (FCFS: anybody swapped out keeps everyone
  waiting);
* the running groups leave the first waiting request its sequence slots when its
  client has fewer running than the busiest one (FCFS: the running groups may
  take every slot, and a client running ``max_num_seqs`` sequences keeps every
  newcomer waiting until one of them ends).

With a single client every rank compares as FCFS does, so every plan is the
same as under ``FirstComeFirstServed`` (``tests/step05_preemption``). The
scheduler says who the client is: the server gives each request its peer's
address (``Engine.add_request(client=...)``).
"""

from __future__ import annotations

from collections import Counter

from paged.step03_attention.request import Request


# --8<-- [start:fair]
class FairShare:
    """Order: the client with the fewest requests running goes first; within a client, FCFS."""

    def __init__(self) -> None:
        # queue name -> client -> how many of the client's requests that queue holds
        self.counts: dict[str, Counter] = {"waiting": Counter(), "running": Counter(), "swapped": Counter()}

    def share(self, client: str) -> int:
        """How many requests ``client`` has running (on the device)."""
        return self.counts["running"][client]

    def rank(self, req: Request) -> tuple[int, int]:
        return self.share(req.client), req.arrival

    def first(self, queue) -> Request:
        """The oldest request of the least-served client in ``queue`` (kept in arrival order)."""
        clients = self.counts[queue[0].queue]
        heads: dict[str, Request] = {}  # each client's oldest request in the queue
        for req in queue:
            if req.client not in heads:
                heads[req.client] = req
                if self.share(req.client) == 0 or len(heads) == len(clients):
                    break  # nobody can rank before a client with nothing running; or every client seen
        return min(heads.values(), key=self.rank)

    def waits(self, req: Request, swapped) -> bool:
        """Swapped requests come back first when their client has no more running than ``req``'s."""
        mine = self.share(req.client)
        return any(self.share(client) <= mine for client in self.counts["swapped"])

    def held_seqs(self, waiting) -> int:
        """Slots for the first waiting request when its client has fewer running than the busiest client:
        else a client running ``max_num_seqs`` sequences would keep every other waiting until one ended."""
        if not waiting:
            return 0
        req = self.first(waiting)
        busiest = max(self.counts["running"].values(), default=0)
        return len(req.live_seqs) if self.share(req.client) < busiest else 0

    def moved(self, req: Request, old: str | None, new: str | None) -> None:
        for queue, step in ((old, -1), (new, 1)):
            if queue is not None:
                counts = self.counts[queue]
                counts[req.client] += step
                if counts[req.client] == 0:
                    del counts[req.client]  # only the clients a queue holds now
# --8<-- [end:fair]
