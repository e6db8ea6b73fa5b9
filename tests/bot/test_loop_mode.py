"""The loop's default ``--mode``: static on a GPU unless chosen, the benchmark's own on a CPU."""

from tilegym_bot.bench import LOOP_MODE, with_loop_mode


def test_a_gpu_run_that_names_no_mode_runs_static():
    assert LOOP_MODE == "static"
    assert with_loop_mode(["--timed-runs", "5"], gpu=True) == [
        "--timed-runs",
        "5",
        "--mode",
        "static",
    ]


def test_a_chosen_mode_or_a_cpu_run_is_left_alone():
    assert with_loop_mode(["--mode", "eager"], gpu=True) == ["--mode", "eager"]
    assert with_loop_mode(["--mode=eager"], gpu=True) == ["--mode=eager"]
    assert with_loop_mode([], gpu=False) == []
    assert with_loop_mode(["--device", "cpu"], gpu=True) == ["--device", "cpu"]
