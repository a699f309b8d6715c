"""A session's directories, renames, usage and interrupts through the Python API: the real
sandbox, its supervisor doing each call with the files API's rules."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from execbox import Executor, Limits, UsageError
from execbox.sessions import Session

SMALL = Limits(timeout_s=30, memory_mib=256, pids=32, disk_mib=8)


@pytest.fixture
def session(executor: Executor) -> Iterator[Session]:
    with executor.session(limits=SMALL) as s:
        yield s


def _value(session: Session, code: str) -> str:
    result = session.run(code)
    assert result.ok, result.error
    return [o.data for o in result.outputs if o.mime_type == "text/plain"][-1]


def test_make_dir_makes_parents_and_says_whether_it_was_there(session: Session) -> None:
    assert session.files.make_dir("a/b/c") is True
    assert session.files.make_dir("a/b") is False
    assert session.files.make_dir("empty") is True
    files, dirs = session.files.tree()
    assert files == [] and dirs == ["a", "a/b", "a/b/c", "empty"]
    # The sandbox's user owns them: code writes in them.
    assert _value(session, "open('a/b/c/f', 'w').write('x')") == "1"
    session.files.write("a/file.txt", b"f")
    with pytest.raises(UsageError, match="not a directory"):
        session.files.make_dir("a/file.txt")
    with pytest.raises(UsageError):
        session.files.make_dir("a/file.txt/sub")
    for bad in ("../x", "/tmp/x", "a/../../x", ""):
        with pytest.raises(UsageError):
            session.files.make_dir(bad)
    session.files.remove("empty")
    assert session.files.tree()[1] == ["a", "a/b", "a/b/c"]


def test_make_dir_and_rename_never_go_through_links(jailed: Executor) -> None:
    with jailed.session(limits=SMALL) as s:
        assert s.run("import os\nos.symlink('/tmp', 'ln')\nopen('f', 'w').write('f')").ok
        with pytest.raises(UsageError):
            s.files.make_dir("ln/x")
        with pytest.raises(UsageError):
            s.files.make_dir("ln")
        with pytest.raises(UsageError):
            s.files.rename("f", "ln/f")
        s.files.rename("ln", "moved")  # the link itself moves, never its target
        seen = "import os\n([n for n in os.listdir('/tmp') if n in 'xf'], os.readlink('moved'))"
        assert _value(s, seen) == "([], '/tmp')"


def test_a_renamed_tree_keeps_its_files_and_is_no_cells_artifact(session: Session) -> None:
    session.files.write("d/one.txt", b"1")
    session.files.write("d/sub/two.txt", b"22")
    session.files.make_dir("d/empty")
    session.files.rename("d", "e/d")
    files, dirs = session.files.tree()
    assert [(f.path, f.size) for f in files] == [("e/d/one.txt", 1), ("e/d/sub/two.txt", 2)]
    assert dirs == ["e", "e/d", "e/d/empty", "e/d/sub"]
    session.files.rename("e/d/one.txt", "top.txt")
    assert session.run("x = 1").artifacts == []  # moved by the caller, not made by the cell
    assert session.files.read("top.txt") == b"1"
    with pytest.raises(UsageError, match="into itself"):
        session.files.rename("e", "e/d/inside")
    with pytest.raises(UsageError, match="no file"):
        session.files.rename("missing", "x")


def test_interrupt_ends_the_running_cell_and_the_session_goes_on(session: Session) -> None:
    assert session.interrupt("idle") is False  # no cell runs
    results = []
    cell = threading.Thread(
        target=lambda: results.append(session.run("import time\ntime.sleep(25)"))
    )
    started = time.monotonic()
    cell.start()
    deadline = time.monotonic() + 10
    while not session.interrupt("stop"):
        assert time.monotonic() < deadline, "the cell never began"
        time.sleep(0.05)
    cell.join(15)
    assert not cell.is_alive() and time.monotonic() - started < 10
    assert results[0].error is not None and results[0].error.type == "KeyboardInterrupt"
    assert _value(session, "1 + 1") == "2"


def test_usage_says_what_the_session_holds(session: Session) -> None:
    before = session.usage()
    assert before.disk_total_bytes > 0 and before.memory_bytes > 0
    session.files.write("blob", b"x" * (2 << 20))
    assert session.run("held = b'x' * (40 << 20)").ok
    after = session.usage()
    assert after.disk_bytes >= before.disk_bytes + (2 << 20)
    assert after.memory_bytes >= before.memory_bytes + (40 << 20)
    assert after.cpu_ns > before.cpu_ns


def _directory_script(s: Session) -> list[object]:
    """The files API's directory calls, each answer (or error class) in order."""
    said: list[object] = []

    def do(call: Callable[[], object]) -> None:
        try:
            said.append(call())
        except UsageError:
            said.append("UsageError")

    files = s.files
    do(lambda: files.make_dir("a/b"))
    do(lambda: files.make_dir("a/b"))
    do(lambda: files.make_dir("a"))
    do(lambda: files.write("a/f.txt", b"x") and None)
    do(lambda: files.make_dir("a/f.txt"))
    do(lambda: files.make_dir("a/f.txt/deeper"))
    do(lambda: [f.path for f in files.tree()[0]] + files.tree()[1])
    do(lambda: files.rename("a", "a/b/inside"))
    do(lambda: files.rename("a", "c"))
    do(lambda: [f.path for f in files.tree()[0]] + files.tree()[1])
    do(lambda: files.read("c/f.txt"))
    do(lambda: files.remove("c"))
    do(lambda: files.remove("c/b"))
    do(lambda: files.rename("c/f.txt", "d/e.txt"))
    do(lambda: files.tree()[1])
    do(lambda: files.remove("c", recursive=True))
    do(lambda: files.remove("d", recursive=True))
    do(lambda: files.tree())
    return said


def test_the_fake_sandbox_answers_directory_calls_as_the_sandbox(
    session: Session, fake_executor: Executor
) -> None:
    """`execbox.testing.FakeSandbox` stands in for the sandbox above its boundary: its
    directories, renames and removals answer as the real supervisor's do."""
    with fake_executor.session(limits=SMALL) as fake:
        assert _directory_script(fake) == _directory_script(session)
