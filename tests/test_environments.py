"""Named, self-contained environments: real builds, offline, from a wheel directory made here."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from execbox import environments, image
from execbox.cli import main
from execbox.environments.elf import ldd
from execbox.errors import SandboxUnavailable, UsageError
from tests.wheels import make_wheel

TINY_INIT = "from tinydep import answer\n\ndef main():\n    print(answer())\n"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tinypkg (with a console script) needs tinydep: resolving must find both."""
    directory = tmp_path_factory.mktemp("wheels")
    make_wheel(directory, "tinydep", {"tinydep/__init__.py": "def answer():\n    return 42\n"})
    make_wheel(
        directory,
        "tinypkg",
        {
            "tinypkg/__init__.py": TINY_INIT,
            "tinypkg-1.0.dist-info/entry_points.txt": "[console_scripts]\ntiny = tinypkg:main\n",
        },
        meta="Requires-Dist: tinydep\n",
    )
    (directory / "requirements.txt").write_text("tinypkg\n")
    return directory


def _build(home: Path, wheels: Path, name: str = "tiny") -> environments.Environment:
    return environments.build(
        name,
        requirements=wheels / "requirements.txt",
        find_links=wheels,
        no_index=True,
        base=home,
        log=False,
    )


@pytest.fixture(scope="module")
def built(
    tmp_path_factory: pytest.TempPathFactory, wheels: Path
) -> tuple[Path, environments.Environment]:
    home = tmp_path_factory.mktemp("home-a")
    return home, _build(home, wheels)


def _tree_python(root: Path, code: str) -> str:
    done = subprocess.run(
        [str(root / "bin" / "python3"), "-I", "-c", code],
        capture_output=True,
        text=True,
        env={},  # nothing from the caller: no PATH, no PYTHONHOME
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_tree_runs_its_own_interpreter_and_imports_its_packages_from_itself(
    built: tuple[Path, environments.Environment],
) -> None:
    _, env = built
    out = _tree_python(
        env.root,
        "import json, sys, tinypkg, json.decoder, _ssl; tinypkg.main(); "
        "print(json.dumps([sys.prefix, sys.base_prefix, sys.executable, sys.path, "
        "tinypkg.__file__, _ssl.__file__]))",
    )
    answer, facts = out.splitlines()
    assert answer == "42"  # tinypkg imported tinydep, resolved from the wheel directory
    prefix, base_prefix, executable, path, *files = json.loads(facts)
    root = str(env.root)
    assert prefix == base_prefix == root
    assert executable.startswith(root + "/")
    assert path and all(p.startswith(root + "/") for p in path), path
    assert all(f.startswith(root + "/") for f in files), files
    assert not (env.root / "pyvenv.cfg").exists()
    # The jail's users read the tree: a 0700 root (mkdtemp's) would hide all of it from them.
    assert env.root.stat().st_mode & 0o777 == 0o755
    # The interpreter's own libraries: libpython (when shared) from the tree, the rest /usr.
    for name, where in ldd(env.root / "bin" / "python3").items():
        assert where.startswith((root + "/", *environments.HOST_LIB_DIRS)), (name, where)
    # No run path names the host's Python install (the loader would search it first).
    elves = [env.root / "bin" / "python3", *(env.root / "lib").glob("**/lib-dynload/*.so")]
    elves += (env.root / "lib").glob("libpython*")
    for elf in elves:
        assert sys.base_prefix not in (environments.runpath(elf) or ""), elf
    host = env.manifest["host_libraries"]
    assert isinstance(host, list) and "libc.so.6" in host
    assert not any("tk" in lib for lib in host)  # tkinter is left out
    stdlib = next((env.root / "lib").glob("python3.*"))
    for left_out in ("test", "idlelib", "tkinter", "ensurepip"):
        assert not (stdlib / left_out).exists(), left_out


def test_a_rebuild_of_a_tree_an_older_execbox_made_brings_its_c_parts_up_to_date(
    built: tuple[Path, environments.Environment], wheels: Path
) -> None:
    """The same requirements built again after an upgrade find the same tree: its jail steps
    must be this execbox's, or every run in it would refuse to start."""
    home, env = built
    meta = json.loads((env.root / "manifest.json").read_text())
    meta["native_sha256"] = "0" * 64  # what an older execbox recorded
    (env.root / "manifest.json").write_text(json.dumps(meta))
    (env.root / "libexec" / "execbox-enter").unlink()
    with pytest.raises(SandboxUnavailable, match="lacks this execbox's init"):
        image.Image.load(env.root)  # control: the tree is stale as an upgrade leaves it
    again = _build(home, wheels)
    assert again.root == env.root
    assert again.manifest["native_sha256"] == image.native_sha()
    assert image.Image.load(again.root).root == env.root.resolve()


def test_the_lock_pins_every_package_with_a_hash_and_scripts_are_dropped(
    built: tuple[Path, environments.Environment], wheels: Path
) -> None:
    _, env = built
    lock = env.root / "requirements.lock"
    environments.check_lock(lock)
    text = lock.read_text()
    want = hashlib.sha256((wheels / "tinydep-1.0-py3-none-any.whl").read_bytes()).hexdigest()
    assert f"tinydep==1.0 \\\n    --hash=sha256:{want}" in text
    assert "tinypkg==1.0" in text
    # pip made bin/tiny with the build path in its shebang; the tree keeps only the interpreter.
    assert sorted(p.name for p in (env.root / "bin").iterdir()) == sorted(
        ["python", "python3", f"python{sys.version_info[0]}.{sys.version_info[1]}"]
    )
    # Bytecode without timestamps: an unchecked hash-based pyc (flags 0b01).
    pyc = next((env.root / "lib").glob("python3.*/site-packages/tinypkg/__pycache__/*.pyc"))
    assert int.from_bytes(pyc.read_bytes()[4:8], "little") == 0b01


def test_two_builds_in_different_directories_are_byte_identical(
    built: tuple[Path, environments.Environment],
    cli_built: Path,
) -> None:
    _, first = built
    root = environments.lookup("tiny", cli_built)
    assert root.is_dir(), "the env CLI test removed it: it must run after this test"
    second = environments.Environment("tiny", root, environments.show("tiny", cli_built))
    assert second.root != first.root
    assert second.manifest["tree_digest"] == first.manifest["tree_digest"]
    assert environments.tree_digest(second.root) == environments.tree_digest(first.root)
    # The image digest runs report covers the same tree, so it is the same too.
    assert second.image.digest == first.image.digest
    # A tree changed after it was built no longer matches its digest.
    victim = next((second.root / "lib").glob("python3.*/site-packages/tinydep/__init__.py"))
    original = victim.read_text()
    victim.write_text(original + "# changed\n")
    try:
        assert not image.verify(second.image)
        assert image.verify(first.image)
    finally:
        victim.write_text(original)
    assert image.verify(second.image)  # control: the check reads the content, nothing else


def test_the_image_digest_covers_the_in_image_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The zygotes import `sandbox/inside` from execbox's source tree, not from the image."""
    before = image.image_digest("sha256:tree")
    copy = tmp_path / "inside"
    copy.mkdir()
    for path in [*image.INSIDE.glob("*.py"), *image.INSIDE.glob("*.js")]:
        (copy / path.name).write_bytes(path.read_bytes())
    monkeypatch.setattr(image, "INSIDE", copy)
    assert image.image_digest("sha256:tree") == before
    (copy / "runner.py").write_text((copy / "runner.py").read_text() + "\n# changed\n")
    changed = image.image_digest("sha256:tree")
    assert changed != before
    (copy / "runner.js").write_text((copy / "runner.js").read_text() + "\n// changed\n")
    assert image.image_digest("sha256:tree") not in (before, changed)


# A builder in a process of its own. It notes when its work began and when it pointed the name
# at its tree, and waits before publishing (up to 2 s) for the other builder: without a lock
# both publish into one tree at once.
RACER = """
import importlib, json, sys, time
from pathlib import Path

home, wheels, meet, me = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
building = importlib.import_module("execbox.environments.build")
copy_python, tree_digest, point = building.copy_python, building.tree_digest, building.point
times = {}

def copy(work, interpreter):
    times["began"] = time.time()
    return copy_python(work, interpreter)

def named(name, tree, base):
    point(name, tree, base)
    times["named"] = time.time()

def at_publish(work):
    (meet / me).touch()
    deadline = time.monotonic() + 2
    while len(list(meet.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    return tree_digest(work)

building.copy_python, building.tree_digest, building.point = copy, at_publish, named
env = building.build(
    "tiny", requirements=wheels / "requirements.txt", find_links=wheels, no_index=True,
    base=home, log=False,
)
print(json.dumps({"root": str(env.root), **times}))
"""


def test_two_processes_building_into_one_home_take_turns(tmp_path: Path, wheels: Path) -> None:
    """Two builds of one environment into one home at once (two `execbox` commands, or two
    test workers): the second waits for the first, and the home ends with one whole tree."""
    home, meet = tmp_path / "home", tmp_path / "meet"
    meet.mkdir()
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(home), str(wheels), str(meet), me],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for me in ("a", "b")
    ]
    outputs = [racer.communicate(timeout=300) for racer in racers]
    for racer, (_, err) in zip(racers, outputs, strict=True):
        assert racer.returncode == 0, err
    first, second = sorted((json.loads(out) for out, _ in outputs), key=lambda r: r["began"])
    assert first["named"] <= second["began"], "the two builds overlapped"
    assert first["root"] == second["root"]
    root = Path(first["root"])
    assert [p.name for p in (home / "envs" / "trees").iterdir() if p.is_dir()] == [root.name]
    assert environments.lookup("tiny", home) == root
    meta = json.loads((root / "manifest.json").read_text())
    assert environments.tree_digest(root) == meta["tree_digest"]
    assert meta["native_sha256"] == image.native_sha()
    image.Image.load(root)  # whole: its init and contain steps are there


def _cli(home: Path, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), env={"EXECBOX_HOME": str(home)})
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def cli_built(tmp_path_factory: pytest.TempPathFactory, wheels: Path) -> Path:
    """A home where `execbox env build tiny` built the same requirements as `built`: the
    second build in another directory that the byte-identical test compares (one build for
    two tests; the env CLI test goes on to remove it, so it runs last)."""
    home = tmp_path_factory.mktemp("home-cli")
    code, _, err = _cli(
        home,
        "env",
        "build",
        "tiny",
        "--requirements",
        str(wheels / "requirements.txt"),
        "--find-links",
        str(wheels),
        "--no-index",
    )
    assert code == 0, err
    return home


def test_env_list_show_default_and_rm_through_the_cli(
    built: tuple[Path, environments.Environment], wheels: Path, cli_built: Path
) -> None:
    _, env = built
    home = cli_built
    # The same lock built under another name: the same tree, reused.
    code, out, err = _cli(
        home,
        "env",
        "build",
        "copy",
        "--lock",
        str(env.root / "requirements.lock"),
        "--find-links",
        str(wheels),
        "--no-index",
    )
    assert code == 0, err
    trees = [p for p in (home / "envs" / "trees").iterdir() if p.is_dir()]
    assert len(trees) == 1
    # Beside it, the filesystem file the jail mounts it from.
    assert sorted(p.name for p in trees[0].parent.iterdir()) == [
        trees[0].name,
        trees[0].name + ".ext4",
    ]
    code, out, _ = _cli(home, "env", "list")
    assert code == 0 and [line.split()[0] for line in out.splitlines()] == ["copy", "tiny"]
    code, out, _ = _cli(home, "env", "show", "tiny")
    shown = json.loads(out)
    assert shown["kind"] == "self-contained"
    assert shown["image_digest"] == env.image.digest
    assert shown["default"] is False
    assert _cli(home, "env", "default") == (0, "data\n", "")
    assert _cli(home, "env", "default", "tiny")[:2] == (0, "tiny\n")
    code, out, _ = _cli(home, "env", "list")
    assert out.startswith("  copy") and "* tiny" in out
    # Runs load the default environment's tree.
    assert image.Image.load(environments.default_root(home)).root == trees[0].resolve()
    code, _, err = _cli(home, "env", "rm", "tiny")
    assert code == 2 and "is the default environment" in err
    assert _cli(home, "env", "rm", "copy")[:2] == (0, "removed copy\n")
    assert trees[0].is_dir()  # tiny still uses it
    assert _cli(home, "env", "default", "copy")[0] == 2
    (home / "envs" / "default").write_text("data\n")
    assert _cli(home, "env", "rm", "tiny")[:2] == (0, "removed tiny\n")
    assert not trees[0].exists() and not list(trees[0].parent.iterdir())
    assert _cli(home, "env", "list") == (0, "", "")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["env", "show", "nope"], "no environment named 'nope'"),
        (["env", "rm", "nope"], "no environment named 'nope'"),
        (["env", "default", "nope"], "no environment named 'nope'"),
        (["env", "build", "Bad/Name", "-r", "x"], "bad environment name 'Bad/Name'"),
        (["env", "build", "other"], "no spec for 'other'"),
        (["env", "build", "x", "-r", "/no/such/requirements.txt"], "requirements file not"),
        (["env", "build", "x", "--lock", "{unhashed}"], "without an exact version and a sha256"),
        (["env", "build", "x", "--lock", "{unpinned}"], "'tinypkg>=1'"),
        (["env", "build", "x", "--lock", "/no/such.lock"], "lock file not found"),
        (["env", "build", "x", "-r", "{unhashed}", "--lock", "{unhashed}"], "not both"),
        (["env", "build", "x", "-r", "{unhashed}", "--no-index"], "needs --find-links"),
    ],
)
def test_bad_input_is_a_clear_error_with_exit_2(
    tmp_path: Path, args: list[str], message: str
) -> None:
    unhashed = tmp_path / "unhashed.lock"
    unhashed.write_text("# a comment\ntinypkg==1.0\n")
    unpinned = tmp_path / "unpinned.lock"
    unpinned.write_text("tinypkg>=1 --hash=sha256:00\n")
    args = [a.format(unhashed=unhashed, unpinned=unpinned) for a in args]
    code, _, err = _cli(tmp_path / "home", *args)
    assert code == 2, err
    assert message in err
    assert not (tmp_path / "home" / "envs" / "trees").exists() or not any(
        (tmp_path / "home" / "envs" / "trees").iterdir()
    )


def test_a_home_without_the_default_environment_says_how_to_build_it(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="execbox image build"):
        environments.default_root(tmp_path)
    with pytest.raises(UsageError, match="execbox env build ml"):
        environments.lookup("ml", tmp_path)


def test_a_home_this_user_may_only_read_still_takes_the_build_lock() -> None:
    # A system image's home, built by root and read by an ordinary user (the rootless
    # container): the lock is taken on the file read-only, not refused.
    import os
    import shutil
    import tempfile

    from execbox.environments.build import build_lock

    home = Path(tempfile.mkdtemp(prefix="execbox-readonly-home-"))  # /tmp: others may enter
    try:
        with build_lock(home):  # made by root, as the image build does
            pass
        for path in (home, *home.rglob("*")):
            path.chmod(0o755 if path.is_dir() else 0o644)
        # Forked, then dropped to nobody: the child reads no file of the tree (a clone under a
        # root-only home is fine), only the lock in `home`.
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            said = b"held"
            try:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
                with build_lock(home):
                    pass
            except BaseException as exc:  # noqa: BLE001 - reported to the parent
                said = repr(exc).encode()
            os.write(write, said)
            os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as fh:
            heard = fh.read().decode()
        os.waitpid(pid, 0)
        assert heard == "held", heard
    finally:
        shutil.rmtree(home)
