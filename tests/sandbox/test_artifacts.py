"""Artifact collection: what comes back from /workspace, and what must never come back.

Collection runs in the supervisor (root) after the run's processes are gone, so everything the
program leaves in the workspace is hostile input to it: links, FIFOs, sockets, odd names, deep
trees, many files, big files.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from execbox import Executor, RunResult, Status
from execbox.cli import write_artifacts

MIB = 1024 * 1024
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def paths(r: RunResult) -> list[str]:
    return [a.path for a in r.artifacts]


def assert_consistent(r: RunResult) -> None:
    """Every artifact's metadata matches its bytes, and the result is valid JSON."""
    for art in r.artifacts:
        assert art.data is not None, art
        assert art.size == len(art.data), art
        assert art.sha256 == hashlib.sha256(art.data).hexdigest(), art
    decoded = json.loads(r.model_dump_json())
    assert [a["path"] for a in decoded["artifacts"]] == paths(r)
    assert sum(a.size for a in r.artifacts) <= r.limits.artifact_bytes
    assert len(r.artifacts) <= r.limits.artifact_files


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if not p.is_dir()}


def _vm_rss() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


# ---- what comes back -------------------------------------------------------------------------


def test_created_files_come_back_with_path_size_sha256_and_mime(executor: Executor) -> None:
    code = (
        "import json, os\n"
        "import pandas as pd\n"
        "os.makedirs('data/deep/er', exist_ok=True)\n"
        "pd.DataFrame({'a': [1, 2], 'b': [3, 4]}).to_csv('data/table.csv', index=False)\n"
        "with open('data/deep/er/info.json', 'w') as fh:\n"
        "    json.dump({'k': 1}, fh)\n"
        "with open('notes.txt', 'w') as fh:\n"
        "    fh.write('hello\\n')\n"
        "open('empty.bin', 'wb').close()\n"
        "with open('blob', 'wb') as fh:\n"
        "    fh.write(bytes(range(256)))\n"
    )
    r = executor.run(code)
    assert r.status is Status.ok, r
    assert r.artifacts_truncated is False
    assert_consistent(r)
    by_path = {a.path: a for a in r.artifacts}
    assert list(by_path) == sorted(by_path)  # path order
    assert set(by_path) == {
        "blob",
        "data/deep/er/info.json",
        "data/table.csv",
        "empty.bin",
        "notes.txt",
    }
    assert by_path["data/table.csv"].data == b"a,b\n1,3\n2,4\n"
    assert by_path["data/table.csv"].mime_type == "text/csv"
    assert by_path["data/deep/er/info.json"].data == b'{"k": 1}'
    assert by_path["data/deep/er/info.json"].mime_type == "application/json"
    assert by_path["notes.txt"].mime_type == "text/plain"
    assert by_path["notes.txt"].size == 6
    assert by_path["notes.txt"].sha256 == hashlib.sha256(b"hello\n").hexdigest()
    assert by_path["empty.bin"].size == 0
    assert by_path["empty.bin"].sha256 == hashlib.sha256(b"").hexdigest()
    assert by_path["blob"].mime_type == "application/octet-stream"
    assert by_path["blob"].data == bytes(range(256))


def test_matplotlib_figure_comes_back_as_image_png(executor: Executor) -> None:
    code = (
        "import matplotlib\n"
        "matplotlib.use('Agg')\n"
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [4, 1, 9])\n"
        "import os\n"
        "os.mkdir('plots')\n"
        "plt.savefig('plots/fig.png')\n"
        "plt.savefig('no_extension', format='png')\n"
    )
    r = executor.run(code)
    assert r.status is Status.ok, r
    assert_consistent(r)
    assert paths(r) == ["no_extension", "plots/fig.png"]
    for art in r.artifacts:
        assert art.mime_type == "image/png"
        assert art.data is not None and art.data.startswith(PNG_MAGIC)
        assert art.size > 1000


def test_inputs_are_readable_read_only_undeletable_and_not_artifacts(jailed: Executor) -> None:
    code = (
        "import os\n"
        "out = []\n"
        "out.append(open('in.csv').read())\n"
        "out.append(open('data/raw.txt', 'rb').read().decode())\n"
        "attempts = {\n"
        "    'write': lambda: open('in.csv', 'w'),\n"
        "    'append': lambda: open('data/raw.txt', 'a'),\n"
        "    'remove': lambda: os.remove('in.csv'),\n"
        "    'remove-sub': lambda: os.remove('data/raw.txt'),\n"
        "    'rename': lambda: os.rename('in.csv', 'moved.csv'),\n"
        "    'chmod': lambda: os.chmod('in.csv', 0o666),\n"
        "    'create-in-input-dir': lambda: open('data/new.txt', 'w'),\n"
        "    'rmdir': lambda: os.rmdir('data'),\n"
        "    'rename-dir': lambda: os.rename('data', 'data2'),\n"
        "}\n"
        "open('replacement', 'w').write('evil')\n"
        "attempts['replace'] = lambda: os.replace('replacement', 'in.csv')\n"
        "for name, call in attempts.items():\n"
        "    try:\n"
        "        call()\n"
        "        out.append(f'{name}:allowed')\n"
        "    except PermissionError:\n"
        "        out.append(f'{name}:denied')\n"
        "    except OSError as exc:\n"
        "        out.append(f'{name}:{exc.__class__.__name__}')\n"
        "out.append(open('in.csv').read())\n"
        "with open('result.txt', 'w') as fh:\n"
        "    fh.write('made')\n"
        "print('|'.join(out))\n"
    )
    r = jailed.run(code, files={"in.csv": b"a,b\n1,2\n", "data/raw.txt": b"raw bytes"})
    assert r.status is Status.ok, r
    assert r.stdout.removesuffix("\n").split("|") == [
        "a,b\n1,2\n",
        "raw bytes",
        "write:denied",
        "append:denied",
        "remove:denied",
        "remove-sub:denied",
        "rename:denied",
        "chmod:denied",
        "create-in-input-dir:denied",
        "rmdir:denied",
        "rename-dir:denied",
        "replace:denied",
        "a,b\n1,2\n",
    ]
    assert paths(r) == ["replacement", "result.txt"]
    assert_consistent(r)


# ---- what never comes back -------------------------------------------------------------------


def test_symlinks_to_host_or_jail_files_are_not_followed(jailed: Executor) -> None:
    code = (
        "import os\n"
        "for name, target in [('passwd', '/etc/passwd'), ('environ', '/proc/1/environ'),\n"
        "                     ('mounts', '/proc/self/mounts'), ('etc', '/etc'),\n"
        "                     ('root', '/'), ('loop', 'loop'), ('up', '..'),\n"
        "                     ('dot', '.'), ('dangling', '/nonexistent/file')]:\n"
        "    os.symlink(target, name)\n"
        "os.makedirs('sub')\n"
        "os.symlink('/etc/hosts', 'sub/hosts.txt')\n"
        "with open('real.txt', 'w') as fh:\n"
        "    fh.write('real')\n"
        "print(len(open('passwd', 'rb').read()))\n"
    )
    r = jailed.run(code)
    assert r.status is Status.ok, r
    assert paths(r) == ["real.txt"]
    assert r.artifacts_truncated is False
    forbidden = set()
    for host_file in ("/etc/passwd", "/proc/1/environ", "/etc/hosts", "/proc/self/mounts"):
        try:
            forbidden.add(Path(host_file).read_bytes())
        except OSError:
            pass
    assert all(a.data not in forbidden for a in r.artifacts)
    assert_consistent(r)


def test_fifo_socket_and_device_attempts_do_not_hang_collection(jailed: Executor) -> None:
    code = (
        "import os, socket, stat\n"
        "os.mkfifo('fifo.txt')\n"
        "os.mkfifo('fifo2.csv')\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "s.bind('sock.txt')\n"
        "s.listen()\n"
        "try:\n"
        "    os.mknod('dev.txt', stat.S_IFCHR | 0o666, os.makedev(1, 3))\n"
        "    print('mknod allowed')\n"
        "except PermissionError:\n"
        "    print('mknod denied')\n"
        "with open('plain.txt', 'w') as fh:\n"
        "    fh.write('p')\n"
    )
    start = time.monotonic()
    r = jailed.run(code, limits={"timeout_s": 10})
    wall = time.monotonic() - start
    assert r.status is Status.ok, r
    assert r.stdout == "mknod denied\n"
    assert paths(r) == ["plain.txt"]
    assert wall < 3.0, wall


# ---- odd names, deep trees, many files --------------------------------------------------------

ODD_NAMES = (
    "import os\n"
    "names = [b'new\\nline.txt', b'bad\\xff.txt', b'x' * 255, b'sp ace', b'-dash', b'.hidden',\n"
    "         'unicod\\u00e9.txt'.encode(), b'..dots', b'back\\\\slash', b'tab\\there',\n"
    "         b'\\x1b[31mred', b'ctl\\x01\\x7f']\n"
    "for i, name in enumerate(names):\n"
    "    fd = os.open(name, os.O_WRONLY | os.O_CREAT, 0o644)\n"
    "    os.write(fd, b'content %d' % i)\n"
    "    os.close(fd)\n"
    "os.makedirs(b'dir\\xfe/sub\\nname')\n"
    "fd = os.open(b'dir\\xfe/sub\\nname/leaf', os.O_WRONLY | os.O_CREAT, 0o644)\n"
    "os.write(fd, b'leaf')\n"
    "os.close(fd)\n"
)
ODD_EXPECTED = {
    "new\nline.txt": b"content 0",
    "bad\\xff.txt": b"content 1",
    "x" * 255: b"content 2",
    "sp ace": b"content 3",
    "-dash": b"content 4",
    ".hidden": b"content 5",
    "unicod\u00e9.txt": b"content 6",
    "..dots": b"content 7",
    "back\\\\slash": b"content 8",
    "tab\there": b"content 9",
    "\x1b[31mred": b"content 10",
    "ctl\x01\x7f": b"content 11",
    "dir\\xfe/sub\nname/leaf": b"leaf",
}


def test_odd_names_come_back_as_valid_json_and_write_artifacts_stays_inside(
    jailed: Executor, tmp_path: Path
) -> None:
    r = jailed.run(ODD_NAMES)
    assert r.status is Status.ok, r
    assert_consistent(r)
    assert {a.path: a.data for a in r.artifacts} == ODD_EXPECTED
    out = tmp_path / "out"
    written = write_artifacts(r, out)
    assert len(written) == len(ODD_EXPECTED)
    assert files_under(tmp_path) == {out / p for p in ODD_EXPECTED}
    for name, data in ODD_EXPECTED.items():
        assert (out / name).read_bytes() == data


def test_artifact_paths_are_unique_even_when_names_differ_only_in_invalid_utf8(
    jailed: Executor,
) -> None:
    # Four distinct names: two undecodable bytes, the literal text an escape would give, and
    # the real U+FFFD a replacement would give.
    code = (
        "import os\n"
        "names = [b'a\\xfe', b'a\\xff', b'a\\\\xff', b'a\\xef\\xbf\\xbd']\n"
        "for i, name in enumerate(names):\n"
        "    fd = os.open(name, os.O_WRONLY | os.O_CREAT, 0o644)\n"
        "    os.write(fd, b'%d' % i)\n"
        "    os.close(fd)\n"
        "print(len(set(os.listdir(b'.'))))\n"
    )
    r = jailed.run(code)
    assert r.status is Status.ok, r
    assert r.stdout == "4\n"
    assert len(r.artifacts) == 4
    assert len(set(paths(r))) == 4, paths(r)


def test_write_artifacts_survives_names_that_collide_after_utf8_replacement(
    jailed: Executor, tmp_path: Path
) -> None:
    # b'\xfe' is a directory holding 'x', b'\xff' is a file: undecodable bytes are escaped.
    code = (
        "import os\n"
        "os.mkdir(b'\\xfe')\n"
        "with open(b'\\xfe/x', 'wb') as fh:\n"
        "    fh.write(b'in dir')\n"
        "with open(b'\\xff', 'wb') as fh:\n"
        "    fh.write(b'file')\n"
        "with open('after.txt', 'wb') as fh:\n"
        "    fh.write(b'after')\n"
    )
    r = jailed.run(code)
    assert r.status is Status.ok, r
    assert sorted(paths(r)) == sorted(["after.txt", "\\xff", "\\xfe/x"])
    out = tmp_path / "out"
    write_artifacts(r, out)  # must not raise on hostile names
    assert (out / "after.txt").read_bytes() == b"after"
    assert all(p.is_relative_to(out) for p in files_under(tmp_path))


def test_deep_directory_tree_returns_and_is_cut_with_artifacts_truncated(
    jailed: Executor, tmp_path: Path
) -> None:
    code = (
        "import os\n"
        "path = '/'.join(['d'] * 200)\n"
        "os.makedirs(path)\n"
        "for depth in (1, 10, 64, 65, 200):\n"
        "    with open('/'.join(['d'] * depth) + f'/at{depth}.txt', 'w') as fh:\n"
        "        fh.write(str(depth))\n"
    )
    start = time.monotonic()
    r = jailed.run(code)
    wall = time.monotonic() - start
    assert r.status is Status.ok, r
    assert paths(r) == ["/".join(["d"] * n) + f"/at{n}.txt" for n in (1, 10, 64)]
    assert r.artifacts_truncated is True
    assert_consistent(r)
    assert wall < 5.0, wall
    write_artifacts(r, tmp_path / "out")
    assert files_under(tmp_path) == {tmp_path / "out" / p for p in paths(r)}


def test_path_longer_than_path_max_comes_back_and_is_written(
    jailed: Executor, tmp_path: Path
) -> None:
    # 20 nested 255-byte directory names: a 5 KB path, more than PATH_MAX (4096).
    code = (
        "import os\n"
        "for i in range(20):\n"
        "    name = str(i % 10) * 255\n"
        "    os.mkdir(name)\n"
        "    os.chdir(name)\n"
        "with open('leaf.txt', 'w') as fh:\n"
        "    fh.write('deep')\n"
    )
    r = jailed.run(code)
    assert r.status is Status.ok, r
    expected = "/".join(str(i % 10) * 255 for i in range(20)) + "/leaf.txt"
    assert paths(r) == [expected]
    assert len(expected.encode()) > 4096
    written = write_artifacts(r, tmp_path / "out")
    assert len(written) == 1
    fd = os.open(tmp_path / "out", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in expected.split("/")[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        leaf = os.open("leaf.txt", os.O_RDONLY, dir_fd=fd)
        assert os.read(leaf, 100) == b"deep"
        os.close(leaf)
    finally:
        os.close(fd)


def test_twenty_thousand_files_are_capped_at_artifact_files(
    jailed: Executor, tmp_path: Path
) -> None:
    code = (
        "for i in range(20_000):\n"
        "    with open(f'f{i:05d}', 'w') as fh:\n"
        "        fh.write(str(i))\n"
    )
    start = time.monotonic()
    r = jailed.run(code, limits={"artifact_files": 50, "timeout_s": 30})
    wall = time.monotonic() - start
    assert r.status is Status.ok, r
    assert paths(r) == [f"f{i:05d}" for i in range(50)]
    assert r.artifacts_truncated is True
    assert_consistent(r)
    assert wall < 15.0, wall
    write_artifacts(r, tmp_path / "out")
    assert len(files_under(tmp_path)) == 50


def test_twenty_thousand_empty_files_in_subdirectories_are_capped(jailed: Executor) -> None:
    code = (
        "import os\n"
        "for d in range(200):\n"
        "    os.mkdir(f'd{d:03d}')\n"
        "    for i in range(100):\n"
        "        open(f'd{d:03d}/e{i:02d}', 'w').close()\n"
    )
    r = jailed.run(code, limits={"artifact_files": 10, "timeout_s": 30})
    assert r.status is Status.ok, r
    assert paths(r) == [f"d000/e{i:02d}" for i in range(10)]
    assert r.artifacts_truncated is True


# ---- byte and file caps ----------------------------------------------------------------------


def test_files_past_artifact_bytes_are_left_out_and_flagged(jailed: Executor) -> None:
    code = (
        "for name in 'abcde':\n"
        "    with open(f'{name}.bin', 'wb') as fh:\n"
        "        fh.write(name.encode() * 400_000)\n"
        "with open('z_small.txt', 'w') as fh:\n"
        "    fh.write('small')\n"
    )
    r = jailed.run(code, limits={"artifact_bytes": MIB})
    assert r.status is Status.ok, r
    assert paths(r) == ["a.bin", "b.bin", "z_small.txt"]
    assert r.artifacts_truncated is True
    assert sum(a.size for a in r.artifacts) == 800_005 <= MIB
    assert_consistent(r)


def test_artifact_over_64_mib_within_artifact_bytes_comes_back(executor: Executor) -> None:
    size = 70 * MIB
    r = executor.run(
        f"open('big.bin', 'wb').write(b'\\x00' * {size})\n",
        limits={"disk_mib": 100, "artifact_bytes": 100 * MIB},
    )
    assert r.status is Status.ok, r
    assert [(a.path, a.size) for a in r.artifacts] == [("big.bin", size)]
    assert r.artifacts[0].sha256 == hashlib.sha256(bytes(size)).hexdigest()


def test_many_artifacts_with_maximal_paths_do_not_crash_the_executor(jailed: Executor) -> None:
    # 10,000 empty files (the artifact_files maximum) 63 directories of 255-byte names deep:
    # 16 KB per path, 165 MB of result metadata if nothing bounds it.
    code = (
        "import os\n"
        "for i in range(63):\n"
        "    name = chr(ord('a') + i % 26) * 255\n"
        "    os.mkdir(name)\n"
        "    os.chdir(name)\n"
        "for i in range(10_000):\n"
        "    os.close(os.open(f'{i:05d}' + 'f' * 250, os.O_CREAT | os.O_WRONLY))\n"
    )
    rss_before = _vm_rss()
    r = jailed.run(code, limits={"artifact_files": 10_000, "timeout_s": 30})  # must not raise
    assert r.status is Status.ok, r
    assert_consistent(r)
    assert _vm_rss() - rss_before < 400 * MIB


def test_zero_artifact_caps_return_nothing_and_flag_truncation(jailed: Executor) -> None:
    code = "open('one.txt', 'w').write('1')\n"
    for limits in ({"artifact_files": 0}, {"artifact_bytes": 0}):
        r = jailed.run(code, limits=limits)
        assert r.status is Status.ok, r
        assert r.artifacts == [], limits
        assert r.artifacts_truncated is True, limits


def test_run_without_new_files_reports_no_artifacts_and_no_truncation(executor: Executor) -> None:
    r = executor.run(
        "print('nothing written')\n",
        files={"in.txt": b"x" * 1000},
        limits={"artifact_files": 1, "artifact_bytes": 10},
    )
    assert r.status is Status.ok, r
    assert r.artifacts == [] and r.artifacts_truncated is False


@pytest.mark.parametrize("mode", [0o000, 0o200])
def test_files_the_program_made_unreadable_are_still_collected(jailed: Executor, mode: int) -> None:
    code = (
        "import os\n"
        "with open('secret.txt', 'w') as fh:\n"
        "    fh.write('mine')\n"
        f"os.chmod('secret.txt', {mode:#o})\n"
        "os.mkdir('locked')\n"
        "with open('locked/inner.txt', 'w') as fh:\n"
        "    fh.write('inner')\n"
        "os.chmod('locked', 0)\n"
    )
    r = jailed.run(code)
    assert r.status is Status.ok, r
    # The files are the program's own: handing them back leaks nothing.
    assert {a.path: a.data for a in r.artifacts} == {
        "locked/inner.txt": b"inner",
        "secret.txt": b"mine",
    }
