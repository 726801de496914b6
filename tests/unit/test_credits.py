"""KV ingress credits: never above the limit, FIFO when credit frees."""

import random

import pytest

from traffic.credits import CreditError, Credits


def ids(grants):
    return [g.request_id for g in grants]


def test_a_d_takes_only_its_credits_and_the_rest_wait():
    credits = Credits(d_credits=2)
    assert ids(credits.ask("a", "d1", now=0.0)) == ["a"]
    assert ids(credits.ask("b", "d1", now=0.1)) == ["b"]
    assert credits.ask("c", "d1", now=0.2) == []
    assert credits.d_in_use["d1"] == 2 and [w.request_id for w in credits.waiting] == ["c"]


def test_waiting_transfers_are_granted_in_fifo_order():
    credits = Credits(d_credits=1)
    credits.ask("a", "d1", now=0.0)
    for index, name in enumerate("bcde"):
        assert credits.ask(name, "d1", now=1.0 + index) == []
    order = []
    for step, holder in enumerate("abcde"):
        granted = credits.release(holder, now=10.0 + step)
        order += ids(granted)
        if granted:
            assert granted[0].granted_s == 10.0 + step
            assert granted[0].wait_s == pytest.approx(10.0 + step - granted[0].asked_s)
    assert order == list("bcde")
    assert credits.peak_d["d1"] == 1


def test_a_transfer_needs_d_credit_and_path_credit():
    credits = Credits(d_credits=4, link_credits=1)
    assert ids(credits.ask("a", "d1", ["s1-s2"])) == ["a"]
    assert credits.ask("b", "d2", ["s1-s2", "s2-s3"]) == []        # link full, D2 free
    assert ids(credits.ask("c", "d3", ["s4-s5"])) == ["c"]          # shares nothing: passes
    assert ids(credits.release("a")) == ["b"]
    assert credits.link_in_use["s1-s2"] == 1 and credits.link_in_use["s2-s3"] == 1


def test_a_later_transfer_never_overtakes_an_earlier_one_it_shares_a_resource_with():
    credits = Credits(d_credits=2, link_credits=1)
    credits.ask("a", "d1", ["L1"])
    assert credits.ask("b", "d1", ["L1"]) == []       # waits for L1
    assert credits.ask("c", "d1", ["L2"]) == []       # D1 has credit, but b is ahead on D1
    assert ids(credits.release("a")) == ["b", "c"]


def test_strict_fifo_blocks_behind_the_head():
    credits = Credits(d_credits=1, strict_fifo=True)
    credits.ask("a", "d1")
    credits.ask("b", "d1")
    assert credits.ask("c", "d2") == []               # d2 is free, but b is first
    assert ids(credits.release("a")) == ["b", "c"]


def test_per_d_and_per_path_limits():
    credits = Credits(d_credits=2, link_credits=None, d_limits={"heavy": 4},
                      link_limits={"path:p1->d1": 1})
    assert len([g for n in range(5) for g in credits.ask(f"h{n}", "heavy")]) == 4
    assert ids(credits.ask("x", "d1", ["path:p1->d1"])) == ["x"]
    assert credits.ask("y", "d1", ["path:p1->d1"]) == []
    assert ids(credits.ask("z", "d1", ["unmetered-link"])) == []     # behind y on d1
    assert ids(credits.release("x")) == ["y", "z"]


def test_best_effort_transfers_take_no_credit():
    credits = Credits(d_credits=1)
    credits.ask("big", "d1")
    grant = credits.ask("short", "d1", best_effort=True)[0]
    assert grant.best_effort and credits.d_in_use["d1"] == 1
    assert credits.release("short") == []
    assert credits.d_in_use["d1"] == 1


def test_cancel_unblocks_the_queue():
    credits = Credits(d_credits=1, link_credits=1)
    credits.ask("a", "d1", ["L"])
    credits.ask("b", "d2", ["L"])
    assert credits.ask("c", "d2", ["M"]) == []        # behind b on d2
    assert ids(credits.cancel("b")) == ["c"]


def test_series_counts_streams_into_a_d_over_time():
    credits = Credits(d_credits=2)
    credits.ask("a", "d1", now=0.0)
    credits.ask("b", "d1", now=1.0)
    credits.ask("c", "d1", now=2.0)
    credits.release("a", now=3.0)
    assert credits.series("d1") == [(0.0, 1), (1.0, 2), (3.0, 1), (3.0, 2)]


@pytest.mark.parametrize("call, match", [
    (lambda c: c.release("ghost"), "holds no credit"),
    (lambda c: c.cancel("ghost"), "not waiting"),
    (lambda c: (c.ask("a", "d1"), c.ask("a", "d2")), "already"),
])
def test_misuse_is_refused(call, match):
    with pytest.raises(CreditError, match=match):
        call(Credits())


@pytest.mark.parametrize("kwargs", [{"d_credits": 0}, {"link_credits": 0},
                                    {"d_limits": {"d": 0}}, {"d_credits": 2.5}])
def test_limits_must_be_positive_integers(kwargs):
    with pytest.raises(CreditError, match=">= 1"):
        Credits(**kwargs)


# ---------------------------------------------------------------- property test
def _schedule(seed, strict):
    rng = random.Random(seed)
    ds = [f"d{i}" for i in range(rng.randint(1, 4))]
    links = [f"L{i}" for i in range(rng.randint(1, 5))]
    credits = Credits(d_credits=rng.randint(2, 4), link_credits=rng.choice([None, 1, 2, 3]),
                      d_limits={ds[0]: rng.randint(1, 4)}, strict_fifo=strict)
    asked, granted_at, order = {}, {}, []
    now = 0.0
    for step in range(rng.randint(20, 120)):
        now += rng.random()
        if credits.active and rng.random() < 0.45:
            new = credits.release(rng.choice(sorted(credits.active)), now)
        else:
            name = f"r{step}"
            needs = (rng.choice(ds), tuple(rng.sample(links, rng.randint(0, len(links)))))
            asked[name] = (len(asked), needs)
            new = credits.ask(name, needs[0], needs[1], now)
        credits.check()
        for grant in new:
            granted_at[grant.request_id] = len(order)
            order.append(grant.request_id)
    while credits.active:                         # drain: everyone is served
        for grant in credits.release(sorted(credits.active)[0], now):
            granted_at[grant.request_id] = len(order)
            order.append(grant.request_id)
        credits.check()
    return credits, asked, granted_at


@pytest.mark.parametrize("strict", [False, True])
def test_random_schedules_never_exceed_a_limit_and_keep_fifo(strict):
    for seed in range(300):
        credits, asked, granted_at = _schedule(seed, strict)
        assert not credits.waiting and set(granted_at) == set(asked), seed
        for d, peak in credits.peak_d.items():
            assert peak <= credits.d_limit(d), (seed, d)
        for link, peak in credits.peak_link.items():
            assert peak <= credits.link_limit(link), (seed, link)
        for a, (index_a, (d_a, links_a)) in asked.items():
            for b, (index_b, (d_b, links_b)) in asked.items():
                shares = d_a == d_b or (credits.link_credits and set(links_a) & set(links_b))
                if index_a < index_b and (shares or strict):
                    assert granted_at[a] < granted_at[b], (seed, a, b)


def test_check_raises_on_any_count_over_its_limit_and_looks_only_at_what_changed():
    credits = Credits(d_credits=2, link_credits=1, d_limits={"d2": 1})
    credits.ask("a", "d1", ["L1"], 0.0)
    credits.ask("b", "d2", ["L2"], 0.0)
    credits.check()
    assert not credits.d_in_use.touched and not credits.link_in_use.touched
    credits.ask("c", "d1", ["L3"], 1.0)               # touches d1 and L3 only
    assert credits.d_in_use.touched == {"d1"} and "L2" not in credits.link_in_use.touched
    credits.check()
    credits.d_in_use["d2"] += 1                       # over d2's own limit of 1
    with pytest.raises(CreditError, match="D 'd2' holds 2 credits, limit 1"):
        credits.check()
    with pytest.raises(CreditError, match="D 'd2'"):  # still wrong: still raises
        credits.check()
    credits.d_in_use["d2"] -= 1
    credits.check()
    credits.link_in_use["L1"] = 2
    with pytest.raises(CreditError, match="link L1 holds 2 credits, limit 1"):
        credits.check()
    credits.link_in_use["L1"] = 1
    credits.release("a", 2.0)
    credits.d_in_use["d9"] -= 1                       # below zero
    with pytest.raises(CreditError, match="D 'd9' holds -1"):
        credits.check()
    credits.d_in_use = {"d1": 3}                      # replaced by a plain dict: all looked at
    with pytest.raises(CreditError, match="D 'd1' holds 3"):
        credits.check()
    fresh = Credits(d_credits=1)
    fresh.ask("x", "d1")
    fresh.check()
    dict.__setitem__(fresh.d_in_use, "d1", 5)         # behind the tracking's back
    fresh.check()                                     # the incremental check cannot see it
    with pytest.raises(CreditError, match="D 'd1' holds 5"):
        fresh.check(full=True)
