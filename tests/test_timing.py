"""The one timer (``aot.timing``): blocks, interleaving with a rotating order, medians."""

import time

from aot import timing


def test_a_block_warms_up_by_time_then_times_its_samples():
    calls, order = [], []

    def fn():
        calls.append(1)
        time.sleep(0.002)

    out = timing.block(fn, 3, warm_s=0.01, per_call=2,
                       around=lambda: order.append("before") or (lambda: order.append("after")))
    assert len(out) == 3 and all(1.5 < ms < 50 for ms in out)  # ms per call
    assert 3 * 2 + 1 <= len(calls) <= 3 * 2 + 10  # one untimed call at least, ~5 for 10 ms
    assert order == ["before", "after"] * 3
    calls.clear()
    timing.block(fn, 2)
    assert len(calls) == 2  # no warm-up asked: none made


def test_interleaved_rotates_the_order_every_round():
    seen = []
    fns = {k: (lambda k=k: seen.append(k)) for k in "abc"}
    samples = timing.interleaved(fns, rounds=3, calls=2, warmup=1)
    assert seen[:3] == ["a", "b", "c"]  # the warm-up calls
    assert "".join(seen[3:]) == "aabbcc" + "bbccaa" + "ccaabb"
    assert {k: len(v) for k, v in samples.items()} == {"a": 6, "b": 6, "c": 6}
    assert list(timing.rotations(["x"], 2)) == [["x"], ["x"]]


def test_medians_and_spread():
    assert timing.medians({"a": [3.0, 1.0, 2.0], "empty": []}) == {"a": 2.0}
    assert timing.spread([1.0, 2.0, 3.0]) == 0.0  # under four samples
    assert timing.spread([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]) == 2.25
    ms = timing.median_ms(lambda: time.sleep(0.003), runs=5)
    assert 2.5 < ms < 60


def test_rounds_go_on_while_any_wants_more():
    counts = {"a": 0, "b": 0, "c": 0}
    wanted = {"a": 1, "b": 3, "c": 2}
    orders = []
    for order in timing.rounds_while(counts, lambda k: counts[k] < wanted[k]):
        orders.append(order)
        for k in order:
            counts[k] += 1
    assert orders == [["a", "b", "c"], ["c", "b"], ["b"]]  # rotated among those left
