"""Drive an engine until every request has finished (shared by the step03+ engine tests)."""


def drain(engine, requests, max_steps: int = 10_000) -> dict:
    """Add ``(request_id, prompt_token_ids, params)`` requests, step until done; finished outputs by id.

    Fails (instead of hanging) if the engine has not finished after ``max_steps`` iterations, and
    if any device block is still in use afterwards.
    """
    for rid, prompt, params in requests:
        engine.add_request(rid, prompt, params)
    done, steps = {}, 0
    while engine.has_unfinished():
        steps += 1
        assert steps <= max_steps, f"the engine did not finish within {max_steps} steps"
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    assert engine.scheduler.kv.allocator.num_used == 0, "blocks leaked"
    return done
