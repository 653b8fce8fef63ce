"""framework/sebulba/runtime.py: the rate limiter's bound checked on counts at every grant, and the blocking primitives'
timeouts and stops."""
import threading
import time

import numpy as np
import pytest

from lightspeed.framework.sebulba.runtime import (
    BoundedQueue,
    ParameterStore,
    RateLimiter,
    RateLimitExceeded,
    RuntimeStopped,
    RuntimeWaitTimeout,
    StopSignal,
)

WAKE_SECONDS = 0.2  # a stop must wake a blocked waiter within this


class BoundChecker:
    """on_grant hook: after every grant, -E <= diff <= E once min_inserts is reached, except the documented
    overshoot of the block that reaches min_inserts (and no insert until diff is back under E)."""

    def __init__(self, samples_per_insert: float, min_inserts: int, error_buffer: float):
        self.spi, self.min_inserts, self.error_buffer = samples_per_insert, min_inserts, error_buffer
        self.ceiling, self.previous_inserts, self.grants = error_buffer, 0, 0
        self.violations: list[str] = []

    def __call__(self, kind: str, inserts: int, samples: int) -> None:
        self.grants += 1
        if inserts < self.min_inserts:
            self._expect(samples == 0, f"{kind}: sampled {samples} before min_inserts")
        else:
            diff = (inserts - self.min_inserts) * self.spi - samples
            if kind == "insert" and self.previous_inserts < self.min_inserts:
                self.ceiling = max(self.error_buffer, diff)  # the block that reaches min_inserts may overshoot
            self._expect(-self.error_buffer <= diff <= self.ceiling, f"{kind}: diff={diff} at {inserts}/{samples}")
            if diff <= self.error_buffer:
                self.ceiling = self.error_buffer
        self.previous_inserts = inserts

    def _expect(self, condition: bool, message: str) -> None:
        if not condition:
            self.violations.append(message)


def insert_allowed(inserts, samples, n, spi, min_inserts, error_buffer) -> bool:
    return inserts < min_inserts or (inserts + n - min_inserts) * spi - samples <= error_buffer


def sample_allowed(inserts, samples, k, spi, min_inserts, error_buffer) -> bool:
    return inserts >= min_inserts and (inserts - min_inserts) * spi - samples - k >= -error_buffer


@pytest.mark.parametrize("seed", range(12))
def test_limiter_grants_exactly_what_the_bound_allows(seed):
    rng = np.random.default_rng(seed)
    # dyadic ratios and buffers, so float counts are exact at the boundaries
    spi = float(rng.choice([0.25, 0.5, 1.0, 1.5, 2.0, 3.5, 8.0]))
    min_inserts, error_buffer = int(rng.integers(1, 60)), float(rng.integers(8, 80)) / 2
    checker = BoundChecker(spi, min_inserts, error_buffer)
    limiter = RateLimiter(spi, min_inserts, error_buffer, on_grant=checker)
    refused = 0
    for _ in range(600):
        inserts, samples = limiter.inserts, limiter.samples
        if rng.random() < 0.5:
            n = int(rng.integers(1, 9))
            expected = insert_allowed(inserts, samples, n, spi, min_inserts, error_buffer)
            assert limiter.insert_fits(n) == expected, (inserts, samples, n)
            if expected:
                limiter.insert(n)
            else:
                with pytest.raises(RateLimitExceeded):
                    limiter.insert(n)
        else:
            k = int(rng.integers(1, int(error_buffer) + 1))  # the caller's guarantee: error_buffer >= a round
            expected = sample_allowed(inserts, samples, k, spi, min_inserts, error_buffer)
            assert limiter.try_sample(k) == expected, (inserts, samples, k)
        refused += not expected
        assert (limiter.inserts, limiter.samples) != (inserts, samples) or not expected  # a refusal counts nothing
        assert (limiter.inserts, limiter.samples) == (inserts, samples) or expected
    assert checker.violations == []
    assert checker.grants == 600 - refused and 0 < refused < 600


def test_no_sample_before_min_inserts_then_free_running():
    grants: list[tuple[str, int, int]] = []
    limiter = RateLimiter(None, min_inserts=10, error_buffer=1.0, on_grant=lambda *grant: grants.append(grant))
    assert not limiter.try_sample(1)
    limiter.insert(9)
    assert not limiter.try_sample(1)
    limiter.insert(1)
    assert limiter.try_sample(1000)  # free running: no bound after min_inserts
    assert all(limiter.insert_fits(100) for _ in range(50))  # and every insert fits
    for _ in range(50):
        limiter.insert(100)
    assert grants[:3] == [("insert", 9, 0), ("insert", 10, 0), ("sample", 10, 1000)]
    assert limiter.measured_samples_per_insert == 1000 / 5000


def test_block_crossing_min_inserts_is_granted_then_sampling_catches_up():
    limiter = RateLimiter(4.0, min_inserts=10, error_buffer=8.0)
    limiter.insert(9)
    limiter.insert(20)  # reaches min_inserts: granted although diff becomes 19 * 4 = 76 > 8
    assert limiter.diff == 76 and not limiter.insert_fits(1)  # no insert until sampling brings diff back
    while limiter.try_sample(8):
        pass
    assert limiter.diff - 8 < -8 <= limiter.diff
    assert limiter.insert_fits(1)
    limiter.insert(1)


@pytest.mark.parametrize("spi, min_inserts, block, chunk", [
    (2.0, 160, 8, 32),  # a learner round per 2 blocks
    (4.0, 100, 64, 32),  # 8 learner rounds per block; min_inserts not a multiple of the block
    (0.5, 37, 16, 128),  # a learner round per 16 blocks
    (8.0, 1, 3, 4),
])
def test_the_learner_pattern_holds_the_ratio(spi, min_inserts, block, chunk):
    """The learner's loop (framework/sebulba/trainer.py): insert a round's block, then learn every granted round."""
    error_buffer = max(chunk, spi * block)  # HostRun's sizing: a whole round of samples and of inserts
    checker = BoundChecker(spi, min_inserts, error_buffer)
    limiter = RateLimiter(spi, min_inserts, error_buffer, on_grant=checker)
    rounds, learned = 2000, 0
    for _ in range(rounds):
        limiter.insert(block)  # never beyond the bound: every granted round was learned
        while limiter.try_sample(chunk):
            learned += 1
    assert limiter.inserts == rounds * block and limiter.samples == learned * chunk
    assert -error_buffer <= limiter.diff < chunk - error_buffer  # every granted round learned
    # the reported ratio (runtime/samples_per_insert) is off by at most error_buffer over the inserts counted
    counted = limiter.inserts - min_inserts
    assert abs(limiter.measured_samples_per_insert - spi) * counted <= error_buffer + 1e-9  # float slack at the bound
    assert checker.violations == [] and checker.grants == rounds + learned


def test_insert_beyond_the_bound_raises_with_the_counts():
    limiter = RateLimiter(1.0, min_inserts=4, error_buffer=2.0)
    limiter.insert(6)  # diff = 2: the bound is reached
    with pytest.raises(RateLimitExceeded, match=r"insert of 1 items would leave diff=3\.0 > error_buffer.*"
                       r"inserts=6, samples=0, min_inserts=4, samples_per_insert=1\.0, error_buffer=2\.0"):
        limiter.insert(1)
    assert (limiter.inserts, limiter.samples) == (6, 0)  # nothing counted
    assert limiter.try_sample(1)
    limiter.insert(1)
    assert (limiter.inserts, limiter.samples) == (7, 1)


def test_a_stopped_limiter_raises_on_every_call():
    limiter = RateLimiter(None, min_inserts=1, error_buffer=1.0)
    limiter.insert(1)
    limiter.stop("actor thread 0 failed")
    for call in (lambda: limiter.insert(1), lambda: limiter.try_sample(1)):
        with pytest.raises(RuntimeStopped, match="actor thread 0 failed"):
            call()  # a free-running learner would learn on forever otherwise
    assert (limiter.inserts, limiter.samples) == (1, 0)


def blocked_calls():
    """(primitive, a call that blocks on it) for every blocking call in the module."""
    full_queue = BoundedQueue(1)
    full_queue.put("block")
    empty_queue = BoundedQueue(1)
    return {
        "put": (full_queue, lambda: full_queue.put("another")),
        "get": (empty_queue, lambda: empty_queue.get()),
    }


@pytest.mark.parametrize("call", ["put", "get"])
def test_stop_wakes_a_blocked_waiter_with_the_reason(call):
    primitive, blocking = blocked_calls()[call]
    outcome: list = []

    def wait() -> None:
        try:
            blocking()
        except RuntimeStopped as stopped:
            outcome.append((stopped, time.monotonic()))

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.05)  # let it block
    assert thread.is_alive() and outcome == []
    started = time.monotonic()
    primitive.stop("checkpoint at step 100")
    thread.join(5.0)
    stopped, woke = outcome[0]
    assert woke - started < WAKE_SECONDS
    assert stopped.reason == "checkpoint at step 100" and stopped.cause is None
    with pytest.raises(RuntimeStopped, match="checkpoint at step 100"):
        blocking()  # after a stop, calls raise at once


def test_queue_blocks_when_full_and_when_empty_then_drains():
    queue = BoundedQueue(2)
    with pytest.raises(RuntimeWaitTimeout, match="empty queue"):
        queue.get(timeout=0.05)
    queue.put("a", timeout=0)
    queue.put("b", timeout=0)
    assert queue.fill == 1.0
    start = time.monotonic()
    with pytest.raises(RuntimeWaitTimeout, match="full queue"):
        queue.put("c", timeout=0.1)
    assert 0.1 <= time.monotonic() - start < 0.1 + WAKE_SECONDS
    assert queue.get() == "a" and queue.fill == 0.5
    queue.put("c")
    queue.stop("checkpoint")
    assert queue.drain() == ["b", "c"] and queue.qsize() == 0


def test_queue_put_waits_for_a_get():
    queue = BoundedQueue(1)
    queue.put(1)
    taker = threading.Timer(0.05, queue.get)
    taker.start()
    queue.put(2, timeout=5.0)  # unblocked by the get
    taker.join()
    assert queue.drain() == [2]


def test_parameter_store_newest_version_wins():
    store = ParameterStore({"w": 0}, version=0)
    assert store.latest() == ({"w": 0}, 0)
    assert store.publish({"w": 2}, 2)
    assert not store.publish({"w": 1}, 1)  # a late, older copy does not replace the newer one
    assert store.latest() == ({"w": 2}, 2) and store.version == 2


def test_stop_signal_carries_the_first_error_to_every_waiter():
    signal, queue, limiter = StopSignal(), BoundedQueue(1), RateLimiter(1.0, 1, 1.0)
    signal.register(queue, limiter)
    woken: list[RuntimeStopped] = []

    def learner() -> None:
        try:
            queue.get()
        except RuntimeStopped as stopped:
            woken.append(stopped)
            raise  # an echo of the actor's failure: fail() ignores it

    def actor() -> None:
        raise FloatingPointError("env step returned NaN")

    threads = [threading.Thread(target=signal.guarded("learner", learner)),
               threading.Thread(target=signal.guarded("actor 0", actor))]
    threads[0].start()
    time.sleep(0.05)
    threads[1].start()
    for thread in threads:
        thread.join(5.0)
    assert signal.stopped and signal.where == "actor 0" and woken[0].reason == "actor 0 failed"
    assert isinstance(woken[0].cause, FloatingPointError) and "NaN" in str(woken[0])
    with pytest.raises(RuntimeStopped, match="actor 0 failed"):
        limiter.try_sample(1)
    with pytest.raises(FloatingPointError, match="NaN"):
        signal.raise_if_failed()
    late = BoundedQueue(1)
    signal.register(late)  # registered after the stop: stopped at once
    assert late.stopped


def beat_for(signal: StopSignal, seconds: float) -> tuple[threading.Thread, list[float]]:
    """Another part of the run moving for `seconds`: a granted wait on a primitive of the same signal every
    10 ms, started before this returns; the times of its moves."""
    moving, moves, started = BoundedQueue(1), [], threading.Event()
    signal.register(moving)

    def move() -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            moving.put(0, timeout=1.0)
            moving.get(timeout=1.0)
            moves.append(time.monotonic())
            started.set()
            time.sleep(0.01)

    thread = threading.Thread(target=move)
    thread.start()
    started.wait(5.0)
    return thread, moves


def test_a_registered_wait_runs_out_once_the_whole_run_stops_moving():
    signal, full = StopSignal(), BoundedQueue(1)
    signal.register(full)
    full.put("waiting for a taker")
    mover, moves = beat_for(signal, 0.6)
    start = time.monotonic()
    with pytest.raises(RuntimeWaitTimeout, match="full queue"):
        full.put("more", timeout=0.2)
    end = time.monotonic()
    mover.join()
    # on past its own 0.2 s while the run moved, then out 0.2 s after the last move
    assert end - start >= 0.5 and 0.19 <= end - moves[-1] < 0.2 + WAKE_SECONDS
    full.drain()
    mover, _ = beat_for(signal, 0.6)
    start = time.monotonic()
    with pytest.raises(RuntimeWaitTimeout, match="empty queue"):
        full.get(timeout=0.1, patient=False)  # a poll: its own timeout, however the run moves
    with pytest.raises(RuntimeWaitTimeout, match="empty queue"):
        BoundedQueue(1).get(timeout=0.1)  # an unregistered primitive: the plain timeout
    assert time.monotonic() - start < 0.2 + 2 * WAKE_SECONDS
    mover.join()


def test_a_busy_phase_holds_every_registered_wait_until_it_ends():
    signal, full = StopSignal(), BoundedQueue(1)
    signal.register(full)
    full.put("the learner's report")

    evaluating = threading.Event()

    def evaluate_then_take() -> None:  # the driver evaluating for longer than the timeout, then reading
        with signal.progress.busy():
            evaluating.set()
            time.sleep(0.5)
        full.get(timeout=0)

    driver = threading.Thread(target=evaluate_then_take)
    driver.start()
    evaluating.wait(5.0)
    start = time.monotonic()
    full.put("the next report", timeout=0.1)  # granted once the driver takes: no timeout while it was busy
    driver.join()
    assert time.monotonic() - start >= 0.4 and full.drain() == ["the next report"]


def test_normal_stop_records_no_error():
    signal, store, limiter = StopSignal(), ParameterStore(), RateLimiter(1.0, 1, 1.0)
    signal.register(store, limiter)
    signal.stop("training done")
    signal.raise_if_failed()
    assert signal.wait(0) and store.stopped and limiter.stopped and signal.error is None
    with pytest.raises(RuntimeStopped, match="training done"):
        limiter.insert(1)


@pytest.mark.parametrize("arguments", [(0.0, 1, 1.0), (-1.0, 1, 1.0), (float("nan"), 1, 1.0), (1.0, 0, 1.0),
                                       (1.0, 1, 0.0), (1.0, 1.5, 1.0), (None, 1, float("inf"))])
def test_limiter_rejects_bad_arguments(arguments):
    with pytest.raises(ValueError, match="is not allowed"):
        RateLimiter(*arguments)
