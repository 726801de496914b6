"""Max-min fair rates: textbook examples and a slow reference on random instances."""

import numpy as np
import pytest

from traffic.model.maxmin import max_min_rates


def csr(paths):
    """(indptr, links) of a list of paths (lists of link ids)."""
    indptr = np.zeros(len(paths) + 1, dtype=np.int64)
    indptr[1:] = np.cumsum([len(p) for p in paths])
    links = np.array([link for path in paths for link in path], dtype=np.int64)
    return indptr, links


def rates_of(paths, capacity, caps=None):
    indptr, links = csr(paths)
    return max_min_rates(indptr, links, np.asarray(capacity, dtype=float), caps)


def reference_max_min(paths, capacity, caps):
    """Progressive filling one flow and one link at a time, in plain Python.

    Grows every unfrozen flow by the same small-as-needed step until a link
    fills or a cap is reached; written for clarity, not speed, and without
    the vectorised version's tolerance tricks (exact ties are rare on random
    real numbers).
    """
    n = len(paths)
    rate = [0.0] * n
    frozen = [False] * n
    for f, path in enumerate(paths):
        if any(capacity[link] == 0 for link in path):
            frozen[f] = True
        elif not path:
            rate[f] = caps[f]
            frozen[f] = True
    while not all(frozen):
        step = min(caps[f] - rate[f] for f in range(n) if not frozen[f])
        for link in range(len(capacity)):
            users = [f for f in range(n) if link in paths[f] and not frozen[f]]
            if users:
                load = sum(rate[f] for f in range(n) if link in paths[f])
                step = min(step, (capacity[link] - load) / len(users))
        for f in range(n):
            if not frozen[f]:
                rate[f] += step
        for f in range(n):
            if not frozen[f] and rate[f] >= caps[f] * (1 - 1e-12):
                frozen[f] = True
        for link in range(len(capacity)):
            load = sum(rate[f] for f in range(n) if link in paths[f])
            if load >= capacity[link] * (1 - 1e-12):
                for f in range(n):
                    if link in paths[f]:
                        frozen[f] = True
    return np.array(rate)


def test_two_flows_share_one_link_equally():
    assert rates_of([[0], [0]], [10.0]) == pytest.approx([5.0, 5.0])


def test_bertsekas_gallager_example():
    # Bertsekas & Gallager, Data Networks, section 6.5.2: every link has
    # capacity 1.  Flows 0, 1, 2 share link 0: 1/3 each.  Flow 3 shares link 1
    # with flow 0 only and gets the 2/3 that flow 0 leaves.  Link 2 carries
    # flows 0 and 1 (2/3 in all) and is nobody's bottleneck.
    paths = [[0, 1, 2], [0, 2], [0], [1]]
    got = rates_of(paths, [1.0, 1.0, 1.0])
    assert got == pytest.approx([1 / 3, 1 / 3, 1 / 3, 2 / 3])


def test_two_bottleneck_levels():
    # Four flows on link 0 (capacity 1): 1/4 each.  Flow 3 also crosses link 1
    # (capacity 2), whose other flow takes what is left: 2 - 1/4.
    paths = [[0], [0], [0], [0, 1], [1]]
    got = rates_of(paths, [1.0, 2.0])
    assert got == pytest.approx([0.25, 0.25, 0.25, 0.25, 1.75])


def test_parking_lot():
    # A line of 3 links of capacity 1: one long flow across all of them and one
    # short flow per link.  Every link is shared by two flows: 1/2 each.
    paths = [[0, 1, 2], [0], [1], [2]]
    assert rates_of(paths, [1.0, 1.0, 1.0]) == pytest.approx([0.5] * 4)


def test_parking_lot_with_unequal_links():
    # Link 1 is twice as fast: the long flow is bottlenecked at 1/2 on links 0
    # and 2, and the short flow on link 1 gets the 1.5 left.
    paths = [[0, 1, 2], [0], [1], [2]]
    assert rates_of(paths, [1.0, 2.0, 1.0]) == pytest.approx([0.5, 0.5, 1.5, 0.5])


def test_caps_free_bandwidth_for_others():
    got = rates_of([[0], [0], [0]], [9.0], caps=[1.0, np.inf, np.inf])
    assert got == pytest.approx([1.0, 4.0, 4.0])


def test_one_cap_for_all():
    assert rates_of([[0], [0]], [10.0], caps=2.0) == pytest.approx([2.0, 2.0])


def test_dark_link_gives_zero_and_uses_nothing_elsewhere():
    got = rates_of([[0, 1], [1]], [0.0, 4.0])
    assert got == pytest.approx([0.0, 4.0])


def test_pathless_flow_gets_its_cap_or_infinity():
    got = rates_of([[], [], [0]], [3.0], caps=[7.0, np.inf, np.inf])
    assert got[0] == 7.0 and got[1] == np.inf and got[2] == pytest.approx(3.0)


def test_unconstrained_links():
    got = rates_of([[0, 1], [1]], [np.inf, 6.0])
    assert got == pytest.approx([3.0, 3.0])
    assert rates_of([[0]], [np.inf])[0] == np.inf


def test_no_flows():
    assert len(max_min_rates(np.zeros(1, dtype=np.int64), [], [1.0])) == 0


def test_rejects_unknown_links():
    with pytest.raises(ValueError):
        rates_of([[3]], [1.0])


def test_symmetric_flows_tie_despite_rounding():
    # 3 flows on links of capacity 0.3: floating point 0.3/3 on every link.
    paths = [[i, 3] for i in range(3)]
    got = rates_of(paths, [0.1, 0.1, 0.1, 0.3])
    assert np.all(got == got[0]) and got[0] == pytest.approx(0.1)


@pytest.mark.parametrize("seed", range(40))
def test_matches_reference_on_random_instances(seed):
    rng = np.random.default_rng(seed)
    n_links = int(rng.integers(1, 7))
    n_flows = int(rng.integers(1, 9))
    capacity = rng.uniform(0.5, 10.0, n_links)
    if seed % 5 == 0:
        capacity[rng.integers(n_links)] = 0.0
    paths = []
    for _ in range(n_flows):
        size = int(rng.integers(0 if seed % 7 == 0 else 1, n_links + 1))
        paths.append(sorted(rng.choice(n_links, size=size, replace=False).tolist()))
    caps = np.where(rng.random(n_flows) < 0.3, rng.uniform(0.1, 5.0, n_flows), np.inf)
    expected = reference_max_min(paths, capacity, caps)
    got = rates_of(paths, capacity, caps)
    assert got == pytest.approx(expected, rel=1e-7, abs=1e-9)
    # Feasible: no link over capacity, no flow over its cap.
    indptr, links = csr(paths)
    flow = np.repeat(np.arange(n_flows), np.diff(indptr))
    finite = np.isfinite(got[flow])
    load = np.bincount(links[finite], weights=got[flow][finite], minlength=n_links)
    assert np.all(load <= capacity * (1 + 1e-9) + 1e-12)
    assert np.all(got <= caps * (1 + 1e-9))


@pytest.mark.parametrize("seed", range(10))
def test_unchecked_inputs_give_the_same_rates(seed):
    rng = np.random.default_rng(seed)
    paths = [sorted(rng.choice(6, size=int(rng.integers(1, 4)), replace=False).tolist())
             for _ in range(12)]
    indptr, links = csr(paths)
    capacity = rng.uniform(0.5, 10.0, 6)
    for caps in (None, np.where(rng.random(12) < 0.3, 1.0, np.inf)):
        assert np.array_equal(max_min_rates(indptr, links, capacity, caps),
                              max_min_rates(indptr, links, capacity, caps, check=False))


@pytest.mark.parametrize("seed", range(10))
def test_paths_read_in_place_give_the_csr_rates(seed):
    """The engine's form: each flow's path a slice of one array of every path,
    in any order and with other paths between them."""
    from traffic.model.maxmin import max_min_rates_of_paths

    rng = np.random.default_rng(seed)
    paths = [sorted(rng.choice(8, size=int(rng.integers(0, 5)), replace=False).tolist())
             for _ in range(15)]
    capacity = rng.uniform(0.5, 10.0, 8)
    capacity[0] = 0.0 if seed % 3 == 0 else capacity[0]
    caps = np.where(rng.random(15) < 0.3, rng.uniform(0.1, 5.0, 15), np.inf)
    pool, starts = [], []
    for path in reversed(paths):            # stored out of order, with gaps
        pool += [int(rng.integers(8))] * int(rng.integers(0, 3))
        starts.append(len(pool))
        pool += path
    starts = np.array(starts[::-1], dtype=np.int64)
    lengths = np.array([len(p) for p in paths], dtype=np.int64)
    got = max_min_rates_of_paths(starts, lengths, np.array(pool, dtype=np.int64), capacity,
                                 caps, np.full(8, -1, dtype=np.int64))
    assert np.array_equal(got, rates_of(paths, capacity, caps))


def test_a_link_of_one_flow_caps_it_and_leaves_the_rest_to_the_others():
    # f0 crosses a slow link alone and the shared one; f1 and f2 share the
    # shared link: f0 gets its slow link's 1, the others split the remaining 9.
    assert rates_of([[0, 1], [1], [1]], [1.0, 10.0]) == pytest.approx([1.0, 4.5, 4.5])
    # ... and a tie between a one-flow link and a shared link freezes both at once.
    assert rates_of([[0, 1], [1], [1]], [10.0 / 3, 10.0]) == pytest.approx([10 / 3] * 3)
