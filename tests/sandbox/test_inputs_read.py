"""Which inputs a run read (`RunResult.inputs_read`): the evidence that code used the files it
was given. A read sets a file's access time; placement zeroes it, so a read in the same clock
tick as placement still shows. Looking at a file (listing, stat, open without reading) is not
reading it."""

from __future__ import annotations

from execbox import Executor

FILES = {"sales.csv": b"region,units\nnorth,5\nsouth,3\n", "data/notes.txt": b"hello\n"}


def test_reading_one_input_lists_that_input_only(executor: Executor) -> None:
    run = executor.run(
        "import pandas as pd\nprint(int(pd.read_csv('sales.csv').units.sum()))\n", files=FILES
    )
    assert run.ok, run.stderr
    assert run.stdout == "8\n"
    assert run.inputs_read == ["sales.csv"]


def test_an_input_read_at_once_after_placement_is_seen(executor: Executor) -> None:
    # The first statement reads the file, well within the clock tick (4 ms here) of its
    # placement: without the zeroed access time relatime would record nothing new.
    for _ in range(5):
        run = executor.run("open('data/notes.txt').read(1)\n", files=FILES)
        assert run.ok, run.stderr
        assert run.inputs_read == ["data/notes.txt"]


def test_listing_stat_and_open_without_read_are_not_reads(executor: Executor) -> None:
    code = (
        "import os, json\nnames = sorted(os.listdir('.'))\nos.stat('sales.csv')\n"
        "open('data/notes.txt').close()\nprint(json.dumps(names))\nprint(42)\n"
    )
    run = executor.run(code, files=FILES)
    assert run.ok, run.stderr
    assert run.inputs_read == []


def test_a_read_by_a_child_process_counts(executor: Executor) -> None:
    code = (
        "import os\npid = os.fork()\nif pid == 0:\n"
        "    os.read(os.open('sales.csv', os.O_RDONLY), 10)\n    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
    )
    run = executor.run(code, files=FILES)
    assert run.ok, run.stderr
    assert run.inputs_read == ["sales.csv"]


def test_no_inputs_means_null(executor: Executor) -> None:
    run = executor.run("print(1)\n")
    assert run.ok and run.inputs_read is None


def test_a_session_reports_what_it_has_read_so_far(executor: Executor) -> None:
    with executor.session(files=FILES) as session:
        first = session.run("x = 1")
        second = session.run("text = open('sales.csv').read()")
        third = session.run("y = 2")
    assert (first.inputs_read, second.inputs_read, third.inputs_read) == (
        [],
        ["sales.csv"],
        ["sales.csv"],
    )


def test_a_cached_result_keeps_what_the_run_read(executor: Executor) -> None:
    code = "print(open('sales.csv').read().count('\\n'))  # cached inputs_read\n"
    first = executor.run(code, files=FILES, cache=True)
    second = executor.run(code, files=FILES, cache=True)
    assert not first.cached and second.cached
    assert first.inputs_read == second.inputs_read == ["sales.csv"]
