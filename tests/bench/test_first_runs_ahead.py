"""The first, compiling runs: what the runner sends ahead runs after this process's own first
runs, and everything sent ahead to the worker is answered before any later (timed) run."""

from concurrent.futures import Future

from tilegym_hf_bench.throughput import first_runs, warm_up_sides


class LocalSide:
    def __init__(self, events):
        self.events = events

    def timed(self, tokens, ids=None, label=None):
        self.events.append(f"local {tokens}")
        return 0.5 if tokens > 1 else 0.1, None


class WorkerSide:
    """Answers requests sent ahead only when drained, as a busy worker would."""

    def __init__(self, events):
        self.events = events
        self.queued: list[Future] = []

    def submit_generate(self, tokens):
        future = Future()
        future.tokens = tokens
        self.queued.append(future)
        self.events.append(f"worker sent {tokens}")
        return future

    def _answer(self, up_to):
        while self.queued and self.queued[0] is not up_to:
            self.queued.pop(0).set_result({"_elapsed_s": 2.0})
        if self.queued:
            self.queued.pop(0).set_result({"_elapsed_s": 2.0})

    def wait_started(self):
        self.events.append("worker started")
        for future in list(self.queued)[:2]:
            self._answer(future)

    def drain(self):
        self.events.append(f"worker drained {len(self.queued)}")
        self._answer(None)

    def timed(self, tokens, ids=None, label=None):
        assert not self.queued, "a timed call would wait behind requests sent ahead"
        self.events.append(f"worker timed {tokens}")
        return 0.4, None


def test_ahead_runs_after_the_local_first_runs_and_is_answered_before_return():
    events = []
    worker = WorkerSide(events)

    def ahead():
        events.append("ahead")
        worker.submit_generate(7)  # a correctness case queued behind the first runs

    times = first_runs({"baseline": LocalSide(events), "cutile": worker}, 16, ahead)
    assert times == {"baseline": 0.5, "cutile": 2.0}
    assert events == [
        "worker sent 16",
        "worker sent 1",
        "local 16",
        "local 1",
        "ahead",
        "worker sent 7",
        "worker started",
        "worker drained 1",
    ]


def test_warm_up_calls_ahead_once_and_later_runs_find_the_worker_idle():
    events = []
    worker = WorkerSide(events)
    calls = []

    def ahead():
        calls.append(1)
        worker.submit_generate(7)

    warm = warm_up_sides(
        {"baseline": LocalSide(events), "cutile": worker}, 16, 2, lambda line: None, ahead
    )
    assert calls == [1] and warm.runs >= 2
    assert events.count("worker timed 16") == warm.runs - 1


def test_no_warm_up_runs_no_ahead():
    calls = []
    warm = warm_up_sides({"baseline": LocalSide([])}, 16, 0, lambda line: None, calls.append)
    assert warm.runs == 0 and calls == []
