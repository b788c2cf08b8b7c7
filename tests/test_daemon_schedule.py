"""The daemon's two schedules (polls, supervisor ticks): each in its own thread, one run at a
time, a backoff pushes the next run out, a stuck pass never holds up the other schedule."""

from __future__ import annotations

import threading

from reconciler.daemon.supervisor import Every


def test_a_job_repeats_until_stopped() -> None:
    stop, ran = threading.Event(), threading.Semaphore(0)
    Every("t", 0.01, ran.release, stop).start()
    assert all(ran.acquire(timeout=10) for _ in range(3))
    stop.set()


def test_a_backoff_pushes_the_next_run_out_and_a_stuck_job_does_not_hold_the_other() -> None:
    stop = threading.Event()
    stuck, released = threading.Event(), threading.Event()
    runs: list[str] = []

    def failing() -> None:
        runs.append("poll")
        backing_off.later(3600)  # as a failed poll backs off

    def pass_on_a_stalled_server() -> None:
        stuck.set()
        released.wait(30)

    ticks = threading.Semaphore(0)
    backing_off = Every("poll", 0.01, failing, stop)
    backing_off.start()
    Every("stalled", 0.01, pass_on_a_stalled_server, stop).start()
    assert stuck.wait(10)
    Every("supervise", 0.01, ticks.release, stop).start()
    assert all(ticks.acquire(timeout=10) for _ in range(5))  # ticks go on beside the stuck pass
    assert runs == ["poll"]  # five ticks later, the backed-off job has not run again
    stop.set()
    released.set()


def test_an_error_in_one_run_does_not_end_the_schedule() -> None:
    stop, ran = threading.Event(), threading.Semaphore(0)
    calls = 0

    def flaky() -> None:
        nonlocal calls
        calls += 1
        ran.release()
        if calls == 1:
            raise RuntimeError("a bug in one pass")

    Every("t", 0.01, flaky, stop).start()
    assert all(ran.acquire(timeout=10) for _ in range(2))
    stop.set()
