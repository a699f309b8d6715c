"""A caller's output callback that raises is the caller's failure, never the run's. The pipeline
guards it (`scrub.live_output`) on every face, and the pump (`sandbox/host/pump.py`) does not:
no callback is called again, the run or cell goes on to its end (its slot is reused, a session
stays in step), and the caller gets its own exception once the result is recorded."""

from __future__ import annotations

import time

import pytest

from execbox import Executor, Status
from tests.probes import host_stats

# Prints once, then keeps running: a run killed at its first output never reaches the end.
PRINT_THEN_WORK = (
    "import time\nstate = 'started'\nprint('first', flush=True)\n"
    "time.sleep(0.5)\nprint('second', flush=True)\nstate = 'finished'\n"
)


class CallerGone(Exception):
    pass


def _broken(seen: list[bytes], error: BaseException):  # type: ignore[no-untyped-def]
    def callback(data: bytes) -> None:
        seen.append(data)
        raise error

    return callback


def test_a_raising_output_callback_lets_the_run_finish_and_keeps_its_slot(
    jailed_one_slot: Executor,
) -> None:
    ex = jailed_one_slot
    ex.run("pass")
    slots = host_stats(ex).idle_slots
    seen: list[bytes] = []
    error = CallerGone("the client went away")
    started = time.monotonic()
    with pytest.raises(CallerGone) as caught:
        ex.run(PRINT_THEN_WORK, on_stdout=_broken(seen, error))
    assert caught.value is error  # the caller's own exception, not a sandbox error
    assert seen == [b"first\n"], "a callback that raised was called again"
    # The run was not killed at its first output: it ran to its end and its slot (the same
    # cgroup) is staged again; a slot of a run cut short is closed and replaced by a new one.
    assert time.monotonic() - started >= 0.5
    assert host_stats(ex).idle_slots == slots, "the run's slot was not reused"
    after = ex.run("print('next')")
    assert after.ok and after.stdout == "next\n", after


def test_a_raising_output_callback_lets_the_cell_finish_and_the_session_go_on(
    jailed: Executor,
) -> None:
    seen: list[bytes] = []
    error = CallerGone("the client went away")
    with jailed.session() as s:
        with pytest.raises(CallerGone) as caught:
            s.run(PRINT_THEN_WORK, on_stdout=_broken(seen, error))
        assert caught.value is error
        assert seen == [b"first\n"], "a callback that raised was called again"
        assert not s.closed
        # The cell ran to its end (not interrupted at its first output), and the next cell's
        # output and value are its own: nothing of the first one is left in the pipes.
        r = s.run("print('next')\nstate")
        assert (r.stdout, [o.data for o in r.outputs]) == ("next\n", ["'finished'"]), r


@pytest.mark.parametrize("face", ["run", "cell"])
def test_a_raising_output_callback_is_reported_the_same_on_a_run_and_a_cell(
    jailed: Executor, face: str
) -> None:
    """One guard for both: the caller's own exception, raised once; the callback not called
    again; the code run to its end and recorded as it ended, not as a failure."""
    seen: list[bytes] = []
    error = CallerGone(f"the {face}'s client went away")
    code = PRINT_THEN_WORK + "print(state)\n"
    before = jailed.store.count()
    with jailed.session() as s:
        run = s.run if face == "cell" else jailed.run
        with pytest.raises(CallerGone) as caught:
            run(code, on_stdout=_broken(seen, error))
    assert caught.value is error
    assert seen == [b"first\n"], "a callback that raised was called again"
    assert jailed.store.count() == before + 1, "the run was not recorded"
    record = jailed.store.list(limit=1)[0]
    assert (record.kind, record.status) == (face, Status.ok.value), record
    assert record.result.stdout == "first\nsecond\nfinished\n", record.result
