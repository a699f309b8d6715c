"""The pipeline's side of choosing an environment, over the fake sandbox: what reaches the
backend, the digest on results and in cache keys, the profile rule and its message. The real
sandbox's side is tests/test_environment_runs.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from execbox import Executor
from execbox.contract import RunRequest
from execbox.errors import UsageError
from execbox.policy import check, load_profiles
from execbox.testing import FakeSandbox

DIGESTS = {"ml": "sha256:ml", "other": "sha256:other"}


@pytest.fixture(autouse=True)
def home_of_this_test(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A home (so a records database and cache) of each test's own: the default one outlives
    the test (CI keeps it across runs), and a hit on another test's `print(1)` there would pass
    for a hit of this one's."""
    monkeypatch.setenv("EXECBOX_HOME", str(tmp_path))


def _executor(fake: FakeSandbox, **kw: object) -> Executor:
    profiles = load_profiles()
    profiles["wide"] = profiles["data"].model_copy(update={"environments": ["ml", "other"]})
    return Executor(backend=fake, profiles=profiles, **kw)  # type: ignore[arg-type]


def test_the_backend_gets_the_environments_digest_and_the_default_gets_none() -> None:
    fake = FakeSandbox(environments=DIGESTS, default_environment="data")
    with _executor(fake, cache=False) as ex:
        named = ex.run("print(1)", environment="ml")
        plain = ex.run("print(1)")
        by_name = ex.run("print(1)", environment="data")
    assert [spec.environment for spec in fake.runs] == ["sha256:ml", None, None]
    assert named.image_digest == "sha256:ml"
    assert plain.image_digest == by_name.image_digest == "fake"


def test_cache_keys_differ_by_environment() -> None:
    fake = FakeSandbox(lambda run: "out\n", environments=DIGESTS, default_environment="data")
    with _executor(fake, cache=True) as ex:
        results = [ex.run("print(1)", environment=e, profile="wide") for e in ("ml", "other")]
        results.append(ex.run("print(1)"))
        again = ex.run("print(1)", environment="ml", profile="wide")
    assert [r.cached for r in results] == [False, False, False]
    assert len(fake.runs) == 3 and again.cached and again.image_digest == "sha256:ml"


def test_a_session_passes_its_environment_to_every_cell() -> None:
    fake = FakeSandbox(environments=DIGESTS, default_environment="data")
    with _executor(fake) as ex, ex.session(environment="ml") as s:
        cell = s.run("1")
        assert s.environment == "ml" and cell.image_digest == "sha256:ml"
        record = ex.store.get(cell.run_id)
        assert record is not None and record.environment == "ml"


def test_the_profile_rule_allows_the_default_and_what_it_lists() -> None:
    profiles = load_profiles()

    def verdict(environment: str | None, profile: str = "data") -> tuple[str, str | None]:
        request = RunRequest(code="print(1)", environment=environment, profile=profile)
        v = check(request, profiles, default_environment="data")
        return v.decision, v.rule

    assert verdict(None) == verdict("data") == ("allow", None)
    assert verdict("ml") == ("allow", None)  # the shipped data profile lists it
    assert verdict("ml", "minimal") == ("deny", "environment.not_allowed")
    assert verdict(None, "minimal") == verdict("data", "minimal") == ("allow", None)
    request = RunRequest(code="print(1)", environment="other", profile="data")
    message = check(request, profiles, default_environment="data").message or ""
    assert "'other'" in message and "the default ('data')" in message and "'ml'" in message


@pytest.mark.parametrize("bad", ["ML", "1x", "a b", "../x", "x\n", "", "x" * 33])
def test_environment_names_are_checked_where_they_are_given(bad: str) -> None:
    fake = FakeSandbox(environments=DIGESTS)
    with _executor(fake) as ex:
        with pytest.raises(UsageError, match="environment"):
            ex.run("print(1)", environment=bad)
    profiles = load_profiles()
    with pytest.raises(ValueError, match="environment name"):
        profiles["data"].model_validate({**profiles["data"].model_dump(), "environments": [bad]})
    assert fake.runs == []


def test_an_unknown_environment_is_a_usage_error_and_runs_nothing() -> None:
    fake = FakeSandbox(environments=DIGESTS, default_environment="data")
    profiles = load_profiles()
    profiles["data"] = profiles["data"].model_copy(update={"environments": ["gone"]})
    with Executor(backend=fake, profiles=profiles) as ex:
        with pytest.raises(UsageError, match="no environment named 'gone'"):
            ex.run("print(1)", environment="gone")
        with pytest.raises(UsageError, match="no environment named 'gone'"):
            ex.session(environment="gone")
    assert fake.runs == []


def test_a_zygote_preloads_of_the_warm_imports_only_what_the_tree_has(tmp_path: Path) -> None:
    from execbox.backend import WARM_IMPORTS, warm_imports

    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"modules": ["json", "os"]}))
    assert warm_imports(tmp_path) == []
    # The manifest's `modules` (what the tree's interpreter found importable) decides.
    manifest.write_text(json.dumps({"modules": ["json", "numpy", "pandas", "sklearn", "x"]}))
    assert warm_imports(tmp_path) == [
        m for m in WARM_IMPORTS if m.split(".")[0] in ("numpy", "pandas", "sklearn")
    ]
    assert "numpy.random" in warm_imports(tmp_path) and "scipy" not in warm_imports(tmp_path)
