"""The AOT gate tries a compile again when the compiler crashed (its exit status negative: a
signal), never when it reported an error, and keeps the last error (plain data, no compiler)."""

from tilegym.kernel_inventory.compile import CRASH_RETRIES, crashed, retrying_crashes

ABORT = "CompilerExecutionError: Return code -6"
SEGV = "CompilerExecutionError: Return code -11"
ERROR = "CompilerExecutionError: Return code 1"


def _attempts(*outcomes):
    calls = []

    def attempt():
        calls.append(1)
        return outcomes[len(calls) - 1]

    return attempt, calls


def test_a_signal_is_a_crash_and_an_exit_status_is_not():
    assert crashed(ABORT) and crashed(SEGV)
    assert not crashed(ERROR)
    assert not crashed("TileTypeError: tile shape must be a power of two")
    assert not crashed(None)


def test_a_crash_then_a_success_compiles():
    attempt, calls = _attempts(ABORT, None)
    assert retrying_crashes(attempt) is None
    assert len(calls) == 2


def test_a_compiler_error_is_not_tried_again():
    attempt, calls = _attempts(ERROR, None)
    assert retrying_crashes(attempt) == ERROR
    assert len(calls) == 1


def test_crashes_past_the_retries_stay_a_finding():
    attempt, calls = _attempts(*[SEGV] * (CRASH_RETRIES + 2))
    assert retrying_crashes(attempt) == SEGV
    assert len(calls) == CRASH_RETRIES + 1


def test_a_crash_then_a_real_error_reports_the_error():
    attempt, calls = _attempts(ABORT, ERROR, None)
    assert retrying_crashes(attempt) == ERROR
    assert len(calls) == 2
