"""An environment whose tree has more than the data stack gets a third kind of zygote: runs
that import only the data stack fork the heavy zygote (data stack only), runs that import a
module only the bigger preload has fork the full one, started at the first such run. The
default environment keeps its two kinds. Built here offline from stand-in wheels named like
the modules the tiers preload."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from execbox import environments
from execbox.backend import warm_tiers
from execbox.executor import Executor
from execbox.policy import load_profiles
from execbox.routing import BEYOND_DATA_STACK, program_kind
from tests.probes import alive, host_stats, wait_heavy, wait_until
from tests.wheels import make_wheel

ENV = "tiers"
# What a run's interpreter had imported before its code ran (the text names no module, so
# routing is decided by the import that follows it).
BEFORE = "import sys\nwas = sorted(m for m in ('numpy', 'sklearn') if m in sys.modules)\n"


def test_routing_picks_the_kind_from_the_imports() -> None:
    assert program_kind(frozenset({"json"})) == "light"
    assert program_kind(frozenset({"numpy"})) == "heavy"
    assert program_kind(frozenset({"pandas", "numpy"})) == "pandas"
    assert program_kind(frozenset({"sklearn"})) == "full"
    assert program_kind(frozenset({"pandas", "seaborn"})) == "full"
    assert program_kind(frozenset({"numpy", "statsmodels", "os"})) == "full"
    assert BEYOND_DATA_STACK == {"sklearn", "statsmodels", "seaborn"}


@pytest.fixture(scope="module")
def tiered(tmp_path_factory: pytest.TempPathFactory) -> environments.Environment:
    """Environment `tiers`: stand-ins for numpy (the data stack) and scikit-learn (beyond
    it), so its heavy zygote preloads numpy and its full one scikit-learn too."""
    wheels = tmp_path_factory.mktemp("tiers-wheels")
    make_wheel(
        wheels,
        "numpy",
        # Programs reseed numpy.random after the fork, as for the real one.
        {"numpy/__init__.py": "ANSWER = 1\n", "numpy/random.py": "def seed() -> None: ...\n"},
    )
    make_wheel(
        wheels,
        "sklearn",
        {
            "sklearn/__init__.py": "ANSWER = 2\n",
            "sklearn/linear_model.py": "",
            "sklearn/ensemble.py": "",
        },
    )
    (wheels / "requirements.txt").write_text("numpy\nsklearn\n")
    return environments.build(
        ENV,
        requirements=wheels / "requirements.txt",
        find_links=wheels,
        no_index=True,
        log=False,
    )


@pytest.fixture(scope="module")
def ex(executor: Executor, tiered: environments.Environment) -> Iterator[Executor]:
    """An executor whose `data` profile allows `tiers`."""
    profiles = load_profiles()
    profiles["data"] = profiles["data"].model_copy(update={"environments": [ENV]})
    with Executor(profiles=profiles, pool_size=1, rotate_after_s=None, cache=False) as ex:
        yield ex


def test_the_tiers_follow_what_the_tree_has(tiered: environments.Environment) -> None:
    heavy, full = warm_tiers(tiered.image.root)
    assert heavy == ["numpy", "numpy.random"]
    assert full == ["numpy", "numpy.random", "sklearn", "sklearn.linear_model", "sklearn.ensemble"]


def test_a_data_stack_run_forks_the_small_zygote_and_an_sklearn_run_the_full_one(
    ex: Executor,
) -> None:
    numpy_run = ex.run(BEFORE + "import numpy\nprint(was)\n", environment=ENV)
    assert numpy_run.stdout == "['numpy']\n", numpy_run
    mine = ex.stats().environments[ENV]
    assert mine.taken_by_kind["heavy"] == 1 and mine.taken_by_kind["full"] == 0
    # Started lazily: no run has needed the full zygote yet.
    assert mine.full_zygote_pid is None and not mine.full_ready
    assert mine.staged["full"] == 0
    assert mine.preloaded == ("numpy", "numpy.random")

    sk_run = ex.run(BEFORE + "import sklearn\nprint(was, sklearn.ANSWER)\n", environment=ENV)
    assert sk_run.stdout == "['numpy', 'sklearn'] 2\n", sk_run
    mine = ex.stats().environments[ENV]
    assert mine.taken_by_kind["full"] == 1 and mine.taken_by_kind["heavy"] == 1
    assert mine.full_zygote_pid is not None and mine.full_ready
    assert "sklearn.ensemble" in mine.full_preloaded

    # A data-stack run still forks the small zygote once the full one serves.
    again = ex.run(BEFORE + "import numpy\nprint(was)\n", environment=ENV)
    assert again.stdout == "['numpy']\n", again
    assert ex.stats().environments[ENV].taken_by_kind["heavy"] == 2


def test_the_default_environment_keeps_its_two_kinds(ex: Executor) -> None:
    wait_heavy(ex)
    before = host_stats(ex)
    assert before.full_zygote_pid is None and before.full_preloaded == ()
    assert "numpy" in before.preloaded
    numpy_run = ex.run(BEFORE + "import numpy\nprint(was)\n")
    assert numpy_run.stdout == "['numpy']\n", numpy_run
    # Code importing what only a full zygote preloads runs in a heavy slot: there is none.
    sk_run = ex.run("import sklearn")
    assert sk_run.error is not None and sk_run.error.type == "ModuleNotFoundError", sk_run
    after = host_stats(ex)
    assert after.taken_by_kind["heavy"] - before.taken_by_kind["heavy"] == 2
    assert after.taken_by_kind["full"] == 0 and after.staged["full"] == 0
    assert after.full_zygote_pid is None


def test_a_replacement_host_starts_the_full_zygote_its_predecessor_had(
    tiered: environments.Environment,
) -> None:
    profiles = load_profiles()
    profiles["data"] = profiles["data"].model_copy(update={"environments": [ENV]})
    with Executor(
        profiles=profiles, pool_size=1, rotate_after_runs=3, rotate_after_s=None, cache=False
    ) as ex:
        for _ in range(3):
            run = ex.run(BEFORE + "import sklearn\nprint(was)\n", environment=ENV)
            assert run.stdout == "['numpy', 'sklearn']\n", run
        first = ex.stats().environments[ENV]
        assert first.full_zygote_pid is not None
        assert wait_until(lambda: ex.stats().replacements >= 1, 60), "no replacement"
        second = ex.stats().environments[ENV]
        assert second.zygote_pid != first.zygote_pid
        assert second.full_ready and second.full_zygote_pid not in (None, first.full_zygote_pid)
    # Closing the executor ends every full zygote, the replaced host's included.
    pids = [pid for pid in (first.full_zygote_pid, second.full_zygote_pid) if pid is not None]
    assert len(pids) == 2 and wait_until(lambda: not any(alive(p) for p in pids), 10), pids
