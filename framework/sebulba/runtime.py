"""Thread-safe primitives for the actor-learner runtime (Sebulba shape, one machine): a RateLimiter that holds
the learner's samples per inserted transition near a target, a BoundedQueue that carries experience blocks
from actors to the learner, a ParameterStore through which the learner publishes versioned parameters, and a
StopSignal that records the first error of any thread and stops everything registered with it.

Every blocking call (the queue's put and get; the limiter and the store never block) takes a timeout (None
waits forever) and raises RuntimeWaitTimeout when it runs out, or RuntimeStopped as soon as its primitive is
stopped, so no thread outlives a partner that died. A primitive registered with a StopSignal shares its
Progress clock: its waits run out only once the whole run has made no progress for the timeout, so a partner
that waits on a third thread (a learner held by a long evaluation) is not taken for a dead one."""
import contextlib
import math
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any, Callable, Optional


class RuntimeStopped(RuntimeError):
    """A primitive was stopped while (or before) a thread waited on it; `reason` says why and `cause` holds the
    partner's exception when a failure stopped it (StopSignal.raise_if_failed re-raises that one)."""

    def __init__(self, reason: str, cause: Optional[BaseException] = None):
        self.reason, self.cause = reason, cause
        because = f" (caused by {type(cause).__name__}: {cause})" if cause is not None else ""
        super().__init__(f"Runtime stopped: {reason}{because}")


class RuntimeWaitTimeout(TimeoutError):
    """A blocking call was not granted within its timeout; the message names the side, the wait and the counts."""


def _check_timeout(timeout: Optional[float]) -> None:
    if timeout is not None and not timeout >= 0:
        raise ValueError(f"timeout={timeout!r} is not allowed: None (wait forever) or a number >= 0")


def _check_count(name: str, value: Any) -> None:
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        raise ValueError(f"{name}={value!r} is not allowed: an integer >= 1")


class Progress:
    """When a run last moved: a beat at every granted wait of its primitives, and busy phases (an evaluation, a
    checkpoint write) during which no wait of the run runs out."""

    def __init__(self):
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self._busy = 0

    def beat(self) -> None:
        with self._lock:
            self._last = time.monotonic()

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """A phase of known, unbounded length: the run counts as moving until it ends (which is a beat)."""
        with self._lock:
            self._busy += 1
        try:
            yield
        finally:
            with self._lock:
                self._busy -= 1
                self._last = time.monotonic()

    def quiet_for(self) -> float:
        """Seconds since the last beat; 0 while a busy phase runs."""
        with self._lock:
            return 0.0 if self._busy else time.monotonic() - self._last


class _Stoppable:
    """A condition variable plus a stop that wakes every waiter; the base of the primitives below."""

    def __init__(self):
        self._condition = threading.Condition()  # an RLock inside: callbacks under it may read properties
        self._stop: Optional[RuntimeStopped] = None
        self._progress: Optional[Progress] = None  # set when registered with a StopSignal

    def stop(self, reason: str, cause: Optional[BaseException] = None) -> None:
        """Wake all waiters with RuntimeStopped(reason, cause); later calls raise it at once. The first reason wins."""
        with self._condition:
            if self._stop is None:
                self._stop = RuntimeStopped(reason, cause)
            self._condition.notify_all()

    @property
    def stopped(self) -> bool:
        return self._stop is not None

    def _raise_if_stopped(self) -> None:
        if self._stop is not None:
            # a fresh exception per raise, so tracebacks of different threads do not pile onto one object
            raise RuntimeStopped(self._stop.reason, self._stop.cause)

    def _wait_until(self, ready: Callable[[], bool], timeout: Optional[float], describe: Callable[[float], str],
                    patient: bool = True) -> None:
        """Under the lock: return once ready() holds. With a Progress clock the timeout runs from the run's last
        progress, not from the start of this wait, unless `patient` is False (a poll)."""
        _check_timeout(timeout)
        self._raise_if_stopped()
        if ready():
            self._beat()
            return
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0 and patient and self._progress is not None:
                remaining = timeout - self._progress.quiet_for()  # the run moved since: wait on
                deadline = time.monotonic() + remaining
            if remaining is not None and remaining <= 0:
                raise RuntimeWaitTimeout(describe(time.monotonic() - start))
            self._condition.wait(remaining)
            self._raise_if_stopped()
            if ready():
                self._beat()
                return

    def _beat(self) -> None:
        if self._progress is not None:
            self._progress.beat()


class RateLimitExceeded(RuntimeError):
    """An insert beyond the limiter's bound: the caller inserted again before learning every granted round."""


NOT_READY = 2**62  # a RateLimiter's min_inserts until start_sampling(): no insert count reaches it


class RateLimiter(_Stoppable):
    """Reverb's SampleToInsertRatio, counting items (transitions inserted and transitions sampled) for the one
    learner thread, which inserts a round of blocks and then learns every round the limiter grants. Nothing
    waits on it: insert() counts, try_sample() grants or refuses at once.

    With diff = (inserts - min_inserts) * samples_per_insert - samples, once inserts >= min_inserts:
    - an insert of n fits if diff after it is <= +error_buffer; insert() raises RateLimitExceeded if it does
      not. A caller that learns every granted round of k samples before inserting n leaves diff < k - error_buffer,
      so with error_buffer >= max(k, n * samples_per_insert) its inserts always fit;
    - a sample of k is granted if diff after it is >= -error_buffer (never before min_inserts).
    While inserts < min_inserts, an insert always fits (Reverb's "inserts are free until min_size_to_sample"):
    a block that crosses min_inserts may overshoot the bound by up to its own size times samples_per_insert;
    sampling brings diff back, and no insert fits until it does.
    samples_per_insert=None runs free: samples are granted once min_inserts is reached, every insert fits.
    Once stopped (registered with the run's StopSignal), insert and try_sample raise RuntimeStopped, which ends
    a learner that would otherwise learn on (free running) for an actor that died.

    on_grant(kind, inserts, samples), kind "insert" or "sample", runs under the lock after each grant (a
    test's hook for checking the bound on counts); it must be quick."""

    def __init__(self, samples_per_insert: Optional[float], min_inserts: int, error_buffer: float,
                 on_grant: Optional[Callable[[str, int, int], None]] = None):
        super().__init__()
        finite = lambda value: isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if samples_per_insert is not None and not (finite(samples_per_insert) and samples_per_insert > 0):
            raise ValueError(f"samples_per_insert={samples_per_insert!r} is not allowed: None (free running) or a "
                             "finite number > 0")
        _check_count("min_inserts", min_inserts)
        if not (finite(error_buffer) and error_buffer > 0):
            raise ValueError(f"error_buffer={error_buffer!r} is not allowed: a finite number > 0 (at least one "
                             "learner round's samples)")
        self.samples_per_insert, self.min_inserts, self.error_buffer = samples_per_insert, min_inserts, error_buffer
        self.on_grant = on_grant
        self.inserts = self.samples = 0  # set directly when a run resumes from a checkpoint

    @property
    def diff(self) -> float:
        """Samples owed to (> 0) or taken ahead of (< 0) the target ratio; 0.0 when free running."""
        if self.samples_per_insert is None:
            return 0.0
        return (self.inserts - self.min_inserts) * self.samples_per_insert - self.samples

    @property
    def measured_samples_per_insert(self) -> float:
        return self.samples / max(self.inserts - self.min_inserts, 1)

    def insert_fits(self, n: int) -> bool:
        """Whether an insert of n items is within the bound now."""
        _check_count("n", n)
        with self._condition:
            return self._insert_fits(n)

    def _insert_fits(self, n: int) -> bool:
        if self.samples_per_insert is None or self.inserts < self.min_inserts:
            return True
        return self.diff + n * self.samples_per_insert <= self.error_buffer

    def _sample_fits(self, k: int) -> bool:
        if self.inserts < self.min_inserts:
            return False
        return self.samples_per_insert is None or self.diff - k >= -self.error_buffer

    def _grant(self, kind: str) -> None:
        if self.on_grant is not None:
            self.on_grant(kind, self.inserts, self.samples)

    def _counts(self) -> str:
        return (f"inserts={self.inserts}, samples={self.samples}, min_inserts={self.min_inserts}, "
                f"samples_per_insert={self.samples_per_insert}, error_buffer={self.error_buffer}")

    def start_sampling(self) -> None:
        """Samples may be granted from now on, the ratio counted from the inserts so far (a learner that says when
        it is ready starts the limiter with min_inserts=NOT_READY and calls this then)."""
        with self._condition:
            self.min_inserts = min(self.min_inserts, self.inserts)

    def insert(self, n: int) -> None:
        """Count n inserted items. Raises RateLimitExceeded (nothing counted) beyond the bound, RuntimeStopped."""
        _check_count("n", n)
        with self._condition:
            self._raise_if_stopped()
            if not self._insert_fits(n):
                raise RateLimitExceeded(f"RateLimiter: an insert of {n} items would leave diff="
                                        f"{self.diff + n * self.samples_per_insert} > error_buffer; the learner "
                                        f"inserted before learning every granted round: {self._counts()}")
            self.inserts += n
            self._grant("insert")

    def try_sample(self, k: int) -> bool:
        """Count k sampled items if granted now; False (nothing counted) if not. Raises RuntimeStopped."""
        _check_count("k", k)
        with self._condition:
            self._raise_if_stopped()
            if not self._sample_fits(k):
                return False
            self.samples += k
            self._grant("sample")
            return True


class BoundedQueue(_Stoppable):
    """A FIFO of at most maxsize items between threads; put blocks when full, get when empty. Once stopped (by
    either side, e.g. because the other one died), both raise RuntimeStopped; drain() still returns the rest."""

    def __init__(self, maxsize: int):
        super().__init__()
        _check_count("maxsize", maxsize)
        self.maxsize = maxsize
        self._items: deque = deque()

    def qsize(self) -> int:
        return len(self._items)

    @property
    def fill(self) -> float:
        """qsize / maxsize, a metric: near 1 the learner is the bottleneck, near 0 the actors are."""
        return len(self._items) / self.maxsize

    def put(self, item: Any, timeout: Optional[float] = None) -> None:
        with self._condition:
            self._wait_until(lambda: len(self._items) < self.maxsize, timeout,
                             lambda waited: f"BoundedQueue: put waited {waited:.2f} s (timeout {timeout} s) on a "
                             f"full queue ({len(self._items)}/{self.maxsize} items); nothing took from it")
            self._items.append(item)
            self._condition.notify_all()

    def get(self, timeout: Optional[float] = None, patient: bool = True) -> Any:
        """The oldest item; `patient=False` polls: the timeout runs from this call whatever the run's progress."""
        with self._condition:
            self._wait_until(lambda: bool(self._items), timeout,
                             lambda waited: f"BoundedQueue: get waited {waited:.2f} s (timeout {timeout} s) on an "
                             f"empty queue (maxsize {self.maxsize}); nothing put into it", patient=patient)
            item = self._items.popleft()
            self._condition.notify_all()
            return item

    def drain(self) -> list:
        """Remove and return every item left, oldest first (works after stop, too)."""
        with self._condition:
            items = list(self._items)
            self._items.clear()
            self._condition.notify_all()
            return items


class ParameterStore(_Stoppable):
    """The learner publishes versioned parameters; actors read the newest without blocking. A publish swaps a
    reference under the lock, so publish a copy the learner will not mutate (JAX arrays are immutable)."""

    def __init__(self, params: Any = None, version: int = -1):
        super().__init__()
        self._params, self._version = params, version
        self.rounds = 0  # learner rounds done with (on-policy pacing): what wait_for_rounds waits on

    def publish(self, params: Any, version: int) -> bool:
        """Make (params, version) the newest; an older or equal version than the stored one is ignored (False)."""
        with self._condition:
            if version <= self._version:
                return False
            self._params, self._version = params, version
            return True

    def rounds_done(self, rounds: int) -> None:
        """The learner is done with `rounds` rounds (publish their parameters first): waiting actors go on."""
        with self._condition:
            self.rounds = max(self.rounds, rounds)
            self._condition.notify_all()

    def wait_for_rounds(self, rounds: int, timeout: Optional[float]) -> tuple[Any, int]:
        """The newest (params, version) once the learner has published after `rounds` rounds: an on-policy actor
        waits here so that its next block is acted with parameters at most its lag behind. Raises
        RuntimeWaitTimeout after `timeout` s without the run moving, RuntimeStopped once stopped."""
        with self._condition:
            self._wait_until(lambda: self.rounds >= rounds, timeout, lambda waited: (
                f"ParameterStore: an actor waited {waited:.1f} s for the parameters after learner round {rounds} "
                f"(the learner is at round {self.rounds})"))
            return self._params, self._version

    def latest(self) -> tuple[Any, int]:
        """The newest (params, version); (initial params, initial version) before any publish."""
        with self._condition:
            return self._params, self._version

    @property
    def version(self) -> int:
        return self._version


class StopSignal:
    """One place for the first error of any thread: fail() records it and stops every registered primitive,
    so their waiters raise RuntimeStopped; the driver then calls raise_if_failed() to re-raise it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._primitives: list[_Stoppable] = []
        self.progress = Progress()  # the registered primitives' shared clock
        self.reason: Optional[str] = None
        self.error: Optional[BaseException] = None
        self.where: Optional[str] = None

    def register(self, *primitives: _Stoppable) -> None:
        """Stop these with the others, their waits timed from the run's progress; if the signal already fired,
        stop them now."""
        with self._lock:
            self._primitives.extend(primitives)
            for primitive in primitives:
                primitive._progress = self.progress
            reason, error = self.reason, self.error
        if reason is not None:
            for primitive in primitives:
                primitive.stop(reason, error)

    @property
    def stopped(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until stopped or timeout; True if stopped."""
        return self._event.wait(timeout)

    def stop(self, reason: str) -> None:
        """A normal stop (training done, a checkpoint): stops everything, records no error."""
        self._fire(reason, None)

    def fail(self, error: BaseException, where: str) -> None:
        """Record `error` raised in `where` (the first one wins) and stop everything. A RuntimeStopped is only
        the echo of an earlier stop, so it is not recorded as an error."""
        if isinstance(error, RuntimeStopped):
            return
        with self._lock:
            if self.error is None:
                self.error, self.where = error, where
        self._fire(f"{where} failed", error)

    def _fire(self, reason: str, error: Optional[BaseException]) -> None:
        with self._lock:
            if self.reason is None:
                self.reason = reason
            primitives = list(self._primitives)
        self._event.set()
        for primitive in primitives:
            primitive.stop(reason, error)

    def raise_if_failed(self) -> None:
        """Re-raise the first recorded error (in the caller's thread); nothing if none."""
        if self.error is not None:
            raise self.error

    def guarded(self, where: str, function: Callable[..., Any], *args: Any) -> Callable[[], None]:
        """A thread target that runs function(*args) and fail()s with whatever it raises."""

        def target() -> None:
            try:
                function(*args)
            except BaseException as error:  # noqa: B036 - any error in a thread must reach the driver
                self.fail(error, where)

        return target
