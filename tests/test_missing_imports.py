"""Curation from demand: each environment's manifest lists what code can import there; a run
that imports a module its environment lacks is told which environments have it, its record
notes the module, and `execbox env requests` lists what was asked for. Real builds from wheels
made here, a real sandbox, real SQLite."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from execbox import Executor, RunRequest, Status, environments
from execbox.cli import main
from execbox.image import Image
from execbox.policy import load_profiles
from execbox.policy.checker import check
from execbox.records import RunStore
from tests.wheels import make_wheel


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two environments: 'tiny' (tinypkg, the default) and 'other' (otherpkg)."""
    wheels = tmp_path_factory.mktemp("wheels")
    make_wheel(wheels, "tinypkg", {"tinypkg/__init__.py": "ANSWER = 42\n"})
    make_wheel(wheels, "otherpkg", {"otherpkg/__init__.py": "ANSWER = 7\n"})
    home = tmp_path_factory.mktemp("home")
    for name, package in (("tiny", "tinypkg"), ("other", "otherpkg")):
        (wheels / f"{name}.txt").write_text(f"{package}\n")
        environments.build(
            name,
            requirements=wheels / f"{name}.txt",
            find_links=wheels,
            no_index=True,
            base=home,
            log=False,
        )
    environments.set_default("tiny", home)
    return home


def _digest(home: Path, name: str) -> str:
    return Image.load(environments.lookup(name, home)).digest


def test_each_manifest_lists_its_importable_modules_and_old_ones_gain_the_list(
    home: Path,
) -> None:
    root = environments.lookup("tiny", home)
    modules = environments.modules_of(root)
    assert {"tinypkg", "json", "collections", "sys", "_ssl"} <= modules
    assert "otherpkg" not in modules
    assert not {"tkinter", "idlelib", "test", "__pycache__"} & modules  # left out of the tree
    manifest = root / "manifest.json"
    meta = json.loads(manifest.read_text())
    assert meta["modules"] == sorted(modules)
    del meta["modules"]  # a tree built before the list was recorded
    manifest.write_text(json.dumps(meta))
    assert environments.modules_of(root) == modules
    assert json.loads(manifest.read_text())["modules"] == sorted(modules)


def test_the_hint_names_the_environments_that_have_the_module(home: Path) -> None:
    tiny = _digest(home, "tiny")
    assert environments.having("otherpkg", home) == ["other"]
    assert environments.having("json", home) == ["other", "tiny"]
    assert environments.missing_hint("otherpkg", tiny, None, home) == (
        "otherpkg is not in environment 'tiny'; environment 'other' has it "
        "(run with --environment other)"
    )
    # Only the environments the caller may use count.
    refused = environments.missing_hint("otherpkg", tiny, ["tiny"], home)
    assert refused is not None and "no environment its profile allows has it" in refused
    assert "'other'" not in refused
    assert "execbox env requests" in refused
    # The environment has the top-level module: a submodule was missing, no hint.
    assert environments.missing_hint("tinypkg", tiny, None, home) is None


def test_the_hint_reads_each_manifest_once_per_change_of_the_environments(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny = _digest(home, "tiny")
    other = environments.lookup("other", home)
    names = home / "envs" / "names"
    reads: list[str] = []
    read_text = Path.read_text

    def counted(self: Path, *args: Any, **kwargs: Any) -> str:
        if self.name == "manifest.json":
            reads.append(self.parent.name)
        return read_text(self, *args, **kwargs)

    def hint() -> str | None:
        return environments.missing_hint("otherpkg", tiny, None, home)

    monkeypatch.setattr(Path, "read_text", counted)
    hint()
    reads.clear()
    manifest = other / "manifest.json"
    manifest.write_text(read_text(manifest))  # rewritten (as a rebuild of its C parts does)
    os.utime(manifest, ns=(0, 0))
    first = hint()
    assert first == (
        "otherpkg is not in environment 'tiny'; environment 'other' has it "
        "(run with --environment other)"
    )
    assert reads == [other.name]  # the changed manifest, once; tiny's is known
    reads.clear()
    (names / "third").symlink_to(Path("..") / "trees" / other.name)  # a new name: noticed
    try:
        both = hint()
        assert both is not None and "environments 'other', 'third' have it" in both
        assert reads == []  # the same tree, unchanged: nothing to read
        for _ in range(20):
            assert hint() == both
        assert environments.having("otherpkg", home) == ["other", "third"]
        assert reads == []  # no change, no read
    finally:
        (names / "third").unlink()
    assert hint() == first and reads == []  # the name gone: noticed, nothing read


@pytest.fixture(scope="module")
def tiny_executor(
    home: Path, executor: Executor, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Executor, str]]:
    """A real sandbox running the 'tiny' environment (`executor`: skips where none can run)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("EXECBOX_HOME", str(home))
    url = f"sqlite:///{tmp_path_factory.mktemp('records')}/runs.db"
    profiles = dict(load_profiles())
    profiles["data"] = profiles["data"].model_copy(update={"environments": ["other"]})
    profiles["held"] = profiles["data"].model_copy(
        update={"name": "held", "missing_imports": "approval"}
    )
    profiles["closed"] = profiles["data"].model_copy(update={"name": "closed", "environments": []})
    try:
        with Executor(
            image=Image.load(environments.lookup("tiny", home)),
            records=url,
            profiles=profiles,
            cache=False,
        ) as ex:
            yield ex, url
    finally:
        mp.undo()


def test_a_run_missing_a_module_is_told_where_it_is_and_its_record_notes_it(
    tiny_executor: tuple[Executor, str], home: Path
) -> None:
    ex, url = tiny_executor
    assert ex.run("import tinypkg\nprint(tinypkg.ANSWER)").stdout == "42\n"
    r = ex.run("import json\nimport otherpkg\n")
    assert r.status is Status.error and r.error is not None, r
    assert r.error.type == "ModuleNotFoundError"
    assert r.error.message == (
        "No module named 'otherpkg' (otherpkg is not in environment 'tiny'; environment "
        "'other' has it (run with --environment other))"
    )
    nowhere = ex.run("import nowhere_pkg.sub\n")
    assert nowhere.error is not None and "no environment has it" in nowhere.error.message
    sub = ex.run("import tinypkg.nothere\n")  # the environment has tinypkg: no hint
    assert sub.error is not None and sub.error.message == "No module named 'tinypkg.nothere'"
    ex.store.settle()
    rows = ex.store.missing_modules()
    assert [(m, run_id) for m, run_id, _at, _digest in rows] == [
        ("tinypkg", sub.run_id),
        ("nowhere_pkg", nowhere.run_id),
        ("otherpkg", r.run_id),
    ]
    env = {"EXECBOX_HOME": str(home), "EXECBOX_DB_URL": url}
    out = CliRunner().invoke(main, ["env", "requests", "--json"], env=env)
    assert out.exit_code == 0, out.output
    asked = [json.loads(line) for line in out.output.splitlines()]
    assert [(a["module"], a["count"], a["lacked_in"], a["available_in"]) for a in asked] == [
        ("nowhere_pkg", 1, ["tiny"], []),
        ("otherpkg", 1, ["tiny"], ["other"]),
    ]
    assert asked[1]["run_ids"] == [r.run_id]
    again = ex.run("import otherpkg\n")
    ex.store.settle()
    out = CliRunner().invoke(main, ["env", "requests", "--json", "--since", "1h"], env=env)
    counted = {a["module"]: a for a in map(json.loads, out.output.splitlines())}
    assert counted["otherpkg"]["count"] == 2
    assert counted["otherpkg"]["run_ids"] == [again.run_id, r.run_id]  # newest first
    text = CliRunner().invoke(main, ["env", "requests"], env=env)
    assert text.exit_code == 0 and "otherpkg" in text.output and "now in: other" in text.output
    bad = CliRunner().invoke(main, ["env", "requests", "--since", "yesterday"], env=env)
    assert bad.exit_code == 2 and "--since" in bad.output
    # A profile that does not allow 'other' is not sent there.
    closed = ex.run("import otherpkg\n", profile="closed")
    assert closed.error is not None and "'other'" not in closed.error.message, closed.error
    assert "no environment its profile allows has it" in closed.error.message


def test_a_run_asks_for_its_profiles_environments_only_for_a_missing_module(
    tiny_executor: tuple[Executor, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The environments a profile allows name a missing module's hint and nothing else: a run
    without an import error does not work them out (it did for every run)."""
    ex, _url = tiny_executor
    asked: list[str] = []
    allowed = ex.allowed_environments

    def counted(profile: str) -> list[str] | None:
        asked.append(profile)
        return allowed(profile)

    monkeypatch.setattr(ex, "allowed_environments", counted)
    assert ex.run("print(1)").stdout == "1\n" and asked == []
    missing = ex.run("import otherpkg\n")
    assert asked == ["data"] and missing.error is not None
    assert "environment 'other' has it" in missing.error.message, missing.error
    closed = ex.run("import otherpkg\n", profile="closed")
    assert asked == ["data", "closed"] and closed.error is not None
    assert "no environment its profile allows has it" in closed.error.message, closed.error


def test_a_profile_can_hold_a_missing_import_for_approval(
    tiny_executor: tuple[Executor, str], home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ex, _url = tiny_executor
    held = ex.run("import otherpkg\n", profile="held")
    assert held.status is Status.needs_approval, held
    assert held.error is not None and held.error.rule == "import.missing"
    assert "otherpkg" in held.error.message and "--environment other" in held.error.message
    assert ex.run("import tinypkg, json\n", profile="held").status is Status.ok
    # The default profile lets it run (and fail with the hint).
    monkeypatch.setenv("EXECBOX_HOME", str(home))
    profiles = load_profiles()
    assert check(RunRequest(code="import otherpkg\n"), profiles).decision == "allow"


def test_a_record_store_made_before_missing_modules_gains_the_column(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    RunStore(url).close()
    with contextlib.closing(sqlite3.connect(tmp_path / "runs.db")) as conn:
        conn.execute("ALTER TABLE runs DROP COLUMN missing_module")
    store = RunStore(url)
    try:
        assert store.missing_modules() == []
        with contextlib.closing(sqlite3.connect(tmp_path / "runs.db")) as conn:
            names = [r[1] for r in conn.execute("PRAGMA table_info(runs)")]
        assert "missing_module" in names
    finally:
        store.close()
