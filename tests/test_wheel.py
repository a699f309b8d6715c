"""The pip route: `python -m build` makes a wheel that carries everything the image build needs
(the jail's C sources, the runtime's locks, the profiles), and the wheel, installed in a fresh
venv, gives a working `execbox` command."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "execbox"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # From a copy of what the sdist is made of: making it rewrites src/*.egg-info, which the
    # other test processes read (entry points) as they start.
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "src",
        source / "src",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"),
    )
    # The sdist first, then the wheel from it (build's default): the wheel is built in the
    # sdist's unpacked copy, so no scratch lands in the tree, and the sdist is proven whole too.
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("execbox-*-py3-none-any.whl")
    return built


def _source_files() -> set[str]:
    return {
        "execbox/" + path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


def test_the_wheel_holds_every_file_of_the_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        shipped = {name for name in zf.namelist() if name.startswith("execbox/")}
    native = {name for name in shipped if name.startswith("execbox/sandbox/native/")}
    # What the image build compiles and installs from, named so an empty tree cannot pass.
    assert {"execbox/sandbox/native/init.c", "execbox/sandbox/native/nolibc.h"} <= native
    assert "execbox/runtime/requirements.lock" in shipped
    assert "execbox/runtime/ml.lock" in shipped
    assert "execbox/sandbox/inside/runner.js" in shipped
    assert "execbox/profiles.toml" in shipped
    assert shipped == _source_files()


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv with the wheel installed by pip. Its dependencies come from this venv's
    site-packages through a .pth line (resolving them from an index takes minutes on a busy
    machine); execbox itself, its data and its `execbox` command are the wheel's."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps"]
        + ["--no-index", "--quiet", str(wheel)],
        check=True,
        timeout=300,
    )
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # A plain path line: the .pth files there (this checkout's editable execbox) stay unread.
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    yield venv


def _execbox(venv: Path, *args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EXECBOX_HOME": str(home)}
    return subprocess.run(
        [str(venv / "bin" / "execbox"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_the_installed_command_is_the_wheels(installed: Path, tmp_path: Path) -> None:
    where = subprocess.run(
        [str(installed / "bin" / "python"), "-c", "import execbox, sys; print(execbox.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(installed)
    help_text = _execbox(installed, "--help", home=tmp_path)
    assert help_text.returncode == 0, help_text.stderr
    for command in ("run", "doctor", "setup", "serve"):
        assert f"  {command} " in help_text.stdout


def test_doctor_runs_from_the_wheel(installed: Path, tmp_path: Path) -> None:
    """In an empty home the host's checks run from the installed package, and the missing
    runtime image is a FAIL whose fix says how to build it."""
    result = _execbox(installed, "doctor", home=tmp_path / "home")
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:2] == ["ok", "linux"]
    if os.geteuid() == 0:
        image = next(i for i, line in enumerate(lines) if "runtime image" in line)
        assert lines[image].startswith("FAIL")
        assert "execbox image build" in lines[image + 1]
    else:
        assert any(line.startswith("FAIL root") for line in lines)
