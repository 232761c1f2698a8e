"""The route plan's P/D decision (proxy/routing/plan.py's `local_prefill`, a function of
numbers; `decode_full_on`, of the workers' KV counts and the decode pool's pending KV) and
what a leg leases of its worker (`local_prefill_tokens`, `kv_held_tokens`) or a request of
its decode pool (`pending_decode_tokens`). The numbers the router feeds them: test_kv_router.py."""

import pytest

from proxy.fleet.pool import Worker
from proxy.routing.plan import (
    RoutePlan,
    decode_full_on,
    kv_held_tokens,
    local_prefill,
    local_prefill_tokens,
    pending_decode_tokens,
)


@pytest.mark.parametrize(
    "prompt, held, expected",
    [
        (4096, 3900, "cached_on_decode"),  # lacks 196 < 512
        (300, 0, "short_prompt"),
        (300, 900, "cached_on_decode"),  # holds more than the prompt (a longer earlier turn)
        (4096, 0, None),  # long and uncached: disaggregated
        (4096, 3584, None),  # lacks exactly 512: not fewer
    ],
)
def test_the_length_rule_without_queues(prompt, held, expected):
    assert local_prefill(prompt, held, 512) == expected


@pytest.mark.parametrize(
    "prefill_ahead, decode_ahead, expected",
    [
        (4096 + 4096 + 256 + 256, 0, "prefill_queue"),  # one 4k leg queued on the best prefill worker
        (4096 + 256, 0, None),  # only the hand-off's cost ahead: under the margin
        (4096 + 512, 0, None),  # exactly the margin: not more
        (4096 + 513, 0, "prefill_queue"),
        (4096 + 4096 + 256 + 256, 4096, None),  # the decode worker is prefilling 4k of its own
        (4096 + 4096 + 256 + 256, 4096 - 513, "prefill_queue"),
        (None, 0, None),  # no prefill-side accounting: the length rule alone
    ],
)
def test_a_long_uncached_prompt_goes_local_when_the_prefill_queue_is_longer_by_the_margin(
    prefill_ahead, decode_ahead, expected
):
    assert local_prefill(4096, 0, 512, prefill_ahead, decode_ahead) == expected


def test_the_part_the_decode_worker_holds_counts_on_its_side():
    """A decode worker holding 2k of a 6k prompt lacks too much for the length rule, and
    has 4k to do: work ahead on the prefill side is weighed against those 4k, not 6k."""
    assert local_prefill(6000, 2000, 512, 4000 + 512, 0) is None
    assert local_prefill(6000, 2000, 512, 4000 + 513, 0) == "prefill_queue"


def test_the_length_rule_comes_first():
    """A short prompt is `short_prompt` whatever the queues, not `prefill_queue`."""
    assert local_prefill(100, 0, 512, 10_000, 0) == "short_prompt"
    assert local_prefill(4096, 4000, 512, 10_000, 0) == "cached_on_decode"


def test_a_decode_worker_taking_prompts_stops_once_its_queue_catches_up():
    """Prompts of 4k against a prefill pool 16k ahead: each one the decode worker takes adds
    to its own queue, until the difference is under the margin."""
    prefill_ahead, decode_ahead, taken = 16_384 + 4096, 0, 0
    while local_prefill(4096, 0, 512, prefill_ahead, decode_ahead) == "prefill_queue":
        decode_ahead += 4096
        taken += 1
    assert taken == 4  # 16,384 - 4 * 4,096 = 0 <= 512
    assert decode_ahead == 16_384


def test_a_decode_leg_without_kv_leases_what_its_worker_lacks():
    planned, other = Worker("http://d0"), Worker("http://d1")
    plan = RoutePlan([], 4096, None, None, decode_worker=planned, decode_uncached=1000)
    assert local_prefill_tokens(plan, planned) == 1000
    assert local_prefill_tokens(plan, other) == 4096  # a retry's worker: the whole prompt
    assert local_prefill_tokens(RoutePlan([], 4096, None, None, decode_worker=planned), planned) == 0
    assert local_prefill_tokens(None, planned) == 0


def test_a_lease_holds_its_prefill_tokens_until_the_first_token_or_its_release():
    worker = Worker("http://d0")
    first = worker.lease(4096, computed=False, prefilling=1000)
    second = worker.lease(2048, computed=False, prefilling=2048)
    assert worker.local_prefill_tokens == 3048
    first.prefilled()
    first.prefilled()  # idempotent
    assert (worker.local_prefill_tokens, worker.pending_tokens, worker.outstanding) == (2048, 6144, 2)
    first.release()  # its prefill tokens are not given back twice
    assert (worker.local_prefill_tokens, worker.pending_tokens, worker.outstanding) == (2048, 2048, 1)
    second.release()  # never prefilled (failed, client gone): the release gives them back
    second.prefilled()
    assert (worker.local_prefill_tokens, worker.pending_tokens, worker.outstanding) == (0, 0, 0)
    assert worker.churn.value() == 0  # a decode leg's prefill is not the prefill pool's churn


def test_a_zero_margin_never_prefills_on_the_decode_worker_whatever_the_queues():
    assert local_prefill(4096, 0, 0, prefill_ahead=100_000, decode_ahead=0) is None
    assert local_prefill(16, 0, 0) is None


# --- decode_full: a request no decode worker has KV room for, served whole on a prefill worker


def sized(url: str, kv_tokens: int | None, held: int = 0, outstanding: int = 0) -> Worker:
    return Worker(url, outstanding=outstanding, kv_held_tokens=held, kv_tokens=kv_tokens)


def full_decode_pool() -> list[Worker]:
    """Two decode workers of 32k tokens of KV holding seven 4.4k prompts each (the fleet
    benchmark's at 11 QPS): no room for another."""
    return [sized("http://d0", 32_768, 7 * 4400), sized("http://d1", 32_768, 7 * 4400)]


def test_a_request_no_decode_worker_has_room_for_goes_to_the_prefill_worker_with_most_room():
    prefills = [sized("http://p0", 32_768, 4400), sized("http://p1", 32_768, 0), sized("http://p2", None)]
    assert decode_full_on(4400, full_decode_pool(), prefills) is prefills[1]
    prefills[1].kv_held_tokens = 2 * 4400
    assert decode_full_on(4400, full_decode_pool(), prefills) is prefills[0]


def test_of_prefill_workers_with_as_much_room_the_one_with_fewer_legs():
    prefills = [sized("http://p0", 32_768, outstanding=3), sized("http://p1", 32_768, outstanding=1)]
    assert decode_full_on(4400, full_decode_pool(), prefills) is prefills[1]


@pytest.mark.parametrize(
    "decodes, prefills",
    [
        # One decode worker has room: a disaggregated request's decode leg would go there.
        ([sized("http://d0", 32_768, 7 * 4400), sized("http://d1", 32_768, 6 * 4400)], [sized("http://p0", 32_768)]),
        ([sized("http://d0", 32_768, 32_768 - 4400)], [sized("http://p0", 32_768)]),  # fits exactly: room
        # A decode worker of unknown size is never full.
        ([sized("http://d0", 32_768, 7 * 4400), sized("http://d1", None, 7 * 4400)], [sized("http://p0", 32_768)]),
        ([], [sized("http://p0", 32_768)]),  # no decode worker to judge
        # No prefill worker with room: disaggregated as before (it waits for decode KV).
        (full_decode_pool(), [sized("http://p0", 32_768, 32_768 - 4399), sized("http://p1", None)]),
        (full_decode_pool(), []),
    ],
)
def test_otherwise_the_request_is_decided_as_before(decodes, prefills):
    assert decode_full_on(4400, decodes, prefills) is None


def test_a_decode_share_below_one_judges_the_decode_workers_full_earlier_and_only_them():
    """decode_full_share 0.8 of 32,768 tokens: a decode worker holding 5 x 4.4k (22,000) has
    room for a sixth at the whole size (26,400) but not within its share (26,214); the
    prefill workers' room is still judged on their whole size."""
    decodes = [sized("http://d0", 32_768, 5 * 4400), sized("http://d1", 32_768, 5 * 4400)]
    prefills = [sized("http://p0", 32_768, 6 * 4400)]  # 26,400 + 4,400 <= 32,768, over 0.8 of it
    assert decode_full_on(4400, decodes, prefills) is None
    assert decode_full_on(4400, decodes, prefills, decode_share=0.8) is prefills[0]


def test_a_prefill_share_below_one_keeps_room_for_the_prefill_workers_own_legs():
    """decode_full_prefill_share 0.75 of 32,768 tokens (24,576): a prefill worker takes five
    4.4k prompts whole (22,000), not the sixth and seventh it takes at its whole size; a
    prefill leg in flight (its prompt held) leaves room for four. Of two prefill workers,
    the one with the most room within the share: 32,768 holding 4,400 has 15,776 left within
    0.75 and 23,968 in all, 40,768 holding 11,400 has 14,776 and 24,968."""
    prefill = sized("http://p0", 32_768)
    taken = []
    while decode_full_on(4400, full_decode_pool(), [prefill], prefill_share=0.75) is prefill:
        taken.append(prefill.lease(held=4400))
        assert len(taken) < 20
    assert len(taken) == 5
    taken.pop().release()
    prefill.lease(held=4400)  # a prefill leg in flight
    assert decode_full_on(4400, full_decode_pool(), [prefill], prefill_share=0.75) is None
    small, big = sized("http://p1", 32_768, 4400), sized("http://p2", 40_768, 11_400)
    assert decode_full_on(4400, full_decode_pool(), [small, big], prefill_share=0.75) is small
    assert decode_full_on(4400, full_decode_pool(), [small, big]) is big


def test_a_prefill_worker_takes_whole_requests_while_its_count_has_room():
    """Each whole request leases its prompt in the prefill worker's count (as its prefill
    legs do), so a 32k worker takes seven 4.4k prompts (30,800 held), not an eighth."""
    prefill = sized("http://p0", 32_768)
    taken = []
    while decode_full_on(4400, full_decode_pool(), [prefill]) is prefill:
        taken.append(prefill.lease(held=4400))
        assert len(taken) < 20
    assert len(taken) == 7
    taken.pop().release()
    assert decode_full_on(4400, full_decode_pool(), [prefill]) is prefill


def test_a_leg_holds_the_prompt_in_its_workers_kv_under_conditional_disaggregation_only():
    conditional = RoutePlan([], 4096, None, None, decode_worker=Worker("http://d0"))
    assert kv_held_tokens(conditional) == 4096
    assert kv_held_tokens(RoutePlan([], 4096, None, None)) == 0  # no decode worker chosen first: not conditional
    assert kv_held_tokens(None) == 0


# --- decode_full counting the decode pool's pending KV (routing.decode_full_counts_pending)


def roomy_decode_pool(held: int = 5 * 4400) -> list[Worker]:
    """Two decode workers of 32k tokens of KV holding five 4.4k prompts each: 10,768 tokens
    of room each (21,536 in all), room for another prompt on either."""
    return [sized("http://d0", 32_768, held), sized("http://d1", 32_768, held)]


def test_prompts_pending_for_the_decode_pool_fill_it_by_themselves():
    """No decode worker is full by its own count; four 4.4k prompts planned disaggregated
    whose decode legs have not started (17,600) leave 3,936 of the pool's 21,536 tokens of
    room, short of this prompt; three leave 8,336, enough."""
    prefills = [sized("http://p0", 32_768)]
    assert decode_full_on(4400, roomy_decode_pool(), prefills) is None
    assert decode_full_on(4400, roomy_decode_pool(), prefills, pending_tokens=4 * 4400) is prefills[0]
    assert decode_full_on(4400, roomy_decode_pool(), prefills, pending_tokens=3 * 4400) is None
    assert decode_full_on(4400, roomy_decode_pool(), prefills, pending_tokens=21_536 - 4400) is None  # fits exactly
    assert decode_full_on(4400, roomy_decode_pool(), prefills, pending_tokens=21_536 - 4399) is prefills[0]


@pytest.mark.parametrize(
    "decodes, prefills, chosen",
    [
        (full_decode_pool(), [sized("http://p0", 32_768, 4400), sized("http://p1", 32_768)], "http://p1"),
        (roomy_decode_pool(), [sized("http://p0", 32_768)], None),
        (
            [sized("http://d0", 32_768, 7 * 4400), sized("http://d1", 32_768, 6 * 4400)],
            [sized("http://p0", 32_768)],
            None,
        ),
        ([sized("http://d0", 32_768, 7 * 4400), sized("http://d1", None)], [sized("http://p0", 32_768)], None),
        ([], [sized("http://p0", 32_768)], None),
        (full_decode_pool(), [sized("http://p0", 32_768, 32_768 - 4399)], None),
    ],
)
def test_no_pending_tokens_decide_as_the_rule_before_them(decodes, prefills, chosen):
    """With nothing pending the rule is the per-worker one of before: full only when every
    decode worker lacks room, then the prefill worker with the most room (the expected picks
    worked out by hand from that rule)."""
    for picked in (decode_full_on(4400, decodes, prefills, pending_tokens=0), decode_full_on(4400, decodes, prefills)):
        assert (picked.url if picked is not None else None) == chosen


def test_a_decode_worker_of_unknown_size_keeps_the_pool_from_full_whatever_is_pending():
    decodes = [sized("http://d0", 32_768, 7 * 4400), sized("http://d1", None)]
    assert decode_full_on(4400, decodes, [sized("http://p0", 32_768)], pending_tokens=10**9) is None


def test_the_pools_room_is_each_workers_share_less_what_it_holds_none_below_zero():
    """A worker its count puts past its size (d0: 40,000 of 32,768) adds no room, and takes
    none from the others: d1's 32,768 less 28,000 pending leaves room for 4,400. Within a
    share of 0.8 each worker has 0.8 of its size: 17,600 held of two 32k workers leave 17,228,
    and 13,200 pending leave 4,028, short of 4,400 (on their whole sizes, 17,136: room)."""
    prefills = [sized("http://p0", 32_768)]
    over = [sized("http://d0", 32_768, 40_000), sized("http://d1", 32_768, 0)]
    assert decode_full_on(4400, over, prefills, pending_tokens=28_000) is None
    assert decode_full_on(4400, over, prefills, pending_tokens=28_369) is prefills[0]
    held = roomy_decode_pool(4 * 4400)
    assert decode_full_on(4400, held, prefills, pending_tokens=3 * 4400) is None
    assert decode_full_on(4400, held, prefills, decode_share=0.8, pending_tokens=3 * 4400) is prefills[0]


def test_a_pool_full_by_pending_still_needs_a_prefill_worker_with_room():
    prefills = [sized("http://p0", 32_768, 32_768 - 4399), sized("http://p1", None)]
    assert decode_full_on(4400, roomy_decode_pool(), prefills, pending_tokens=10**6) is None


def test_only_a_plan_that_disaggregates_is_pending_decode_kv():
    decode = Worker("http://d0")
    assert pending_decode_tokens(RoutePlan([], 4096, None, None, decode_worker=decode)) == 4096
    for local in ("cached_on_decode", "short_prompt", "prefill_queue"):
        assert pending_decode_tokens(RoutePlan([], 4096, None, None, decode_worker=decode, local_prefill=local)) == 0
    whole = RoutePlan([], 4096, None, None, decode_worker=decode, local_prefill="decode_full", whole_on=Worker("p"))
    assert pending_decode_tokens(whole) == 0
    assert pending_decode_tokens(RoutePlan([], 4096, None, None)) == 0  # not conditional: its decode pick is later
    assert pending_decode_tokens(None) == 0
