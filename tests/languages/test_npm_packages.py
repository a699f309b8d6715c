"""npm packages in an environment: locked with integrity hashes, installed at build time with
`npm ci --ignore-scripts`, read-only to JavaScript runs in that environment, absent elsewhere.

Offline: a fake package is packed here and put in a throwaway npm cache (`npm cache add`), so
npm installs it with `--offline` exactly as it would from the registry. The shipped `js-data`
set is built from the npm registry once (about 30 s of npm on this machine) and skipped, with
the reason, when the registry cannot be reached."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import execbox
from execbox import environments, tools
from execbox.contract import Status
from execbox.environments import npm
from execbox.errors import UsageError
from execbox.executor import Executor
from tests.wheels import make_wheel

FAKE = "execbox-fakepkg"
ENV, ENV2, CURATED = "npmfake", "npmfake-two", "npmcurated"
ANSWER = "console.log(require('execbox-fakepkg').answer(7))"
ESM_ANSWER = "import { answer } from 'execbox-fakepkg';\nconsole.log(answer(7));"

pytestmark = [
    pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed"),
    pytest.mark.timeout(300),  # the first test's set-up builds an environment
]


def _pack(directory: Path, version: str, factor: int, marker: Path) -> str:
    """A tarball of FAKE `version` whose answer(x) is x * factor and whose install scripts
    would touch `marker`; its sha512 integrity."""
    files = {
        "package/package.json": json.dumps(
            {
                "name": FAKE,
                "version": version,
                "license": "MIT",
                "main": "index.js",
                "scripts": {s: f"touch {marker}" for s in ("preinstall", "install", "postinstall")},
            }
        ),
        "package/index.js": f"exports.answer = (x) => x * {factor};\n",
    }
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    tgz = directory / f"{FAKE}-{version}.tgz"
    tgz.write_bytes(raw.getvalue())
    return "sha512-" + base64.b64encode(hashlib.sha512(tgz.read_bytes()).digest()).decode()


def _spec(directory: Path, version: str, integrity: str) -> Path:
    """package.json and a lock pinning FAKE `version` to `integrity`, as npm writes them."""
    directory.mkdir(parents=True)
    deps = {FAKE: version}
    (directory / "package.json").write_text(
        json.dumps({"name": "spec", "version": "1.0.0", "private": True, "dependencies": deps})
    )
    lock = {
        "name": "spec",
        "version": "1.0.0",
        "lockfileVersion": 3,
        "requires": True,
        "packages": {
            "": {"name": "spec", "version": "1.0.0", "dependencies": deps},
            f"node_modules/{FAKE}": {
                "version": version,
                "resolved": f"https://registry.npmjs.org/{FAKE}/-/{FAKE}-{version}.tgz",
                "integrity": integrity,
                "hasInstallScript": True,
                "license": "MIT",
            },
        },
    }
    (directory / "package-lock.json").write_text(json.dumps(lock, indent=2))
    return directory


class Fakes:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.marker = root / "install-script-ran"
        self.cache = root / "npm-cache"
        self.wheels = root / "wheels"
        self.wheels.mkdir()
        make_wheel(self.wheels, "npmprobe", {"npmprobe/__init__.py": "A = 1\n"})
        (self.wheels / "requirements.txt").write_text("npmprobe\n")
        self.integrity = {
            "1.0.0": _pack(root, "1.0.0", 6, self.marker),
            "2.0.0": _pack(root, "2.0.0", 7, self.marker),
        }
        for version in self.integrity:
            subprocess.run(
                [
                    "npm",
                    "cache",
                    "add",
                    str(root / f"{FAKE}-{version}.tgz"),
                    "--cache",
                    str(self.cache),
                ],
                check=True,
                capture_output=True,
            )
        self.spec = _spec(root / "spec-1", "1.0.0", self.integrity["1.0.0"])
        self.spec2 = _spec(root / "spec-2", "2.0.0", self.integrity["2.0.0"])

    def build(self, name: str, spec: Path, cache: Path | None = None) -> environments.Environment:
        return environments.build(
            name,
            requirements=self.wheels / "requirements.txt",
            find_links=self.wheels,
            no_index=True,
            log=False,
            npm_spec=spec,
            npm_cache=cache or self.cache,
            npm_offline=True,
        )

    def content(self, cache: Path, version: str) -> Path:
        """Where npm's cache keeps the tarball of FAKE `version` (by its integrity)."""
        digest = base64.b64decode(self.integrity[version].removeprefix("sha512-")).hex()
        return cache / "_cacache" / "content-v2" / "sha512" / digest[:2] / digest[2:4] / digest[4:]


@pytest.fixture(scope="module")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> Fakes:
    return Fakes(tmp_path_factory.mktemp("npm-fakes"))


@pytest.fixture(scope="module")
def fake_env(fakes: Fakes) -> environments.Environment:
    return fakes.build(ENV, fakes.spec)


@pytest.fixture(scope="module")
def profiles_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped profiles, with `data` and `minimal` allowing this module's environments."""
    text = (Path(execbox.__file__).parent / "profiles.toml").read_text()
    line = 'environments = ["ml", "js-data"]\n'
    start = text.index("[profiles.data]\n")
    assert text.count(line, start, text.index("\n[", start)) == 1, "control: data lists ml"
    allowed = f'environments = ["ml", "js-data", "{ENV}", "{ENV2}", "{CURATED}"]\n'
    text = text.replace(line, allowed, 1)
    start = text.index("[profiles.minimal]\n")
    text = text[:start] + text[start:].replace(
        "module_values =", f'environments = ["{ENV}"]\nmodule_values =', 1
    )
    path = tmp_path_factory.mktemp("npm-profiles") / "profiles.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def ex(
    executor: Executor, fake_env: environments.Environment, profiles_file: Path
) -> Iterator[Executor]:
    """The real sandbox with its result cache on (the cache key must tell environments
    apart)."""
    with Executor(profiles=profiles_file, pool_size=1, rotate_after_s=None) as ex:
        yield ex


def _js(ex: Executor, code: str, environment: str | None = ENV, **kw: object) -> execbox.RunResult:
    return ex.run(code, language="javascript", environment=environment, **kw)  # type: ignore[arg-type]


def test_a_run_in_the_environment_requires_and_imports_its_npm_packages(ex: Executor) -> None:
    for code in (
        ANSWER,
        ESM_ANSWER,
        "import('execbox-fakepkg').then((m) => console.log(m.answer(7)))",
    ):
        result = _js(ex, code)
        assert (result.status, result.stdout, result.error) == (Status.ok, "42\n", None), code


def test_the_packages_are_read_only_to_the_run(ex: Executor) -> None:
    code = """
const fs = require('fs');
const path = require.resolve('execbox-fakepkg');
for (const [what, act] of [
  ['write', () => fs.writeFileSync(path, 'exports.answer = () => 0;')],
  ['add', () => fs.writeFileSync('/node_modules/evil.js', '1')],
  ['unlink', () => fs.unlinkSync('/node_modules')],
  ['chmod', () => fs.chmodSync(path, 0o777)],
]) {
  try { act(); console.log(what, 'done'); } catch (e) { console.log(what, e.code); }
}
"""
    result = _js(ex, code, cache=False)
    assert result.status is Status.ok, result
    lines = dict(line.split() for line in result.stdout.splitlines())
    assert lines["write"] == lines["add"] == lines["chmod"] == "EROFS", result.stdout
    assert lines["unlink"] in ("EROFS", "EACCES", "EPERM"), result.stdout
    assert _js(ex, ANSWER, cache=False).stdout == "42\n"  # the next run's is unchanged


def test_a_run_outside_the_environment_cannot_require_them(ex: Executor) -> None:
    cjs = _js(ex, ANSWER, environment=None)
    assert cjs.status is Status.error and cjs.error is not None
    assert cjs.error.message.startswith(f"Cannot find module '{FAKE}'")
    esm = _js(ex, ESM_ANSWER, environment=None)
    assert esm.error is not None and f"Cannot find package '{FAKE}'" in esm.error.message
    where = _js(ex, "console.log(require('fs').existsSync('/node_modules'))", environment=None)
    assert where.stdout == "false\n"
    # ... nor Python code in the environment that has them: they are Node's.
    py = ex.run("import os; print(os.path.exists('/node_modules'))", environment=ENV)
    assert py.stdout == "True\n"


def test_install_scripts_never_run_at_build(
    fakes: Fakes, fake_env: environments.Environment
) -> None:
    assert fake_env.manifest["npm_packages"] == {FAKE: "1.0.0"}
    assert not fakes.marker.exists()
    # Control: npm itself runs the package's scripts when not told to ignore them.
    work = fakes.root / "control"
    shutil.copytree(fakes.spec, work)
    subprocess.run(
        ["npm", "ci", "--offline", "--cache", str(fakes.cache), "--no-audit", "--no-fund"],
        cwd=work,
        check=True,
        capture_output=True,
    )
    assert fakes.marker.exists()
    fakes.marker.unlink()


def test_a_tampered_tarball_refuses_the_build(
    fakes: Fakes, fake_env: environments.Environment
) -> None:
    cache = fakes.root / "tampered-cache"
    shutil.copytree(fakes.cache, cache)
    # Another package's valid tarball where the pinned one was: a mirror or cache that lies.
    fakes.content(cache, "1.0.0").write_bytes(fakes.content(cache, "2.0.0").read_bytes())
    trees = environments.envs_dir() / "trees"
    before = sorted(trees.iterdir())
    with pytest.raises(
        UsageError, match=f"(?s)npm ci refused the lock.*{FAKE}-1.0.0.tgz.*seems to be corrupted"
    ):
        fakes.build("npmtampered", fakes.spec, cache)
    assert sorted(trees.iterdir()) == before  # nothing of the failed build is left
    with pytest.raises(UsageError, match="no environment named 'npmtampered'"):
        environments.lookup("npmtampered")


def test_a_tampered_lock_refuses_the_build(
    fakes: Fakes, fake_env: environments.Environment
) -> None:
    spec = fakes.root / "tampered-lock"
    shutil.copytree(fakes.spec, spec)
    lock = json.loads((spec / "package-lock.json").read_text())
    other = "sha512-" + base64.b64encode(hashlib.sha512(b"not the package").digest()).decode()
    lock["packages"][f"node_modules/{FAKE}"]["integrity"] = other
    (spec / "package-lock.json").write_text(json.dumps(lock))
    with pytest.raises(UsageError, match="npm ci refused the lock"):
        fakes.build("npmtampered", spec)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"integrity": None}, "no sha512 integrity hash pins it"),
        ({"integrity": "sha1-" + "A" * 26 + "="}, "no sha512 integrity hash pins it"),
        ({"resolved": "file:../evil.tgz"}, "a link, file or git dependency"),
        ({"resolved": "git+ssh://git@example.com/x.git"}, "a link, file or git dependency"),
        ({"link": True}, "a link, file or git dependency"),
    ],
)
def test_a_lock_entry_no_hash_pins_is_refused_before_npm_runs(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(b"x").digest()).decode()
    spec = _spec(tmp_path / "spec", "1.0.0", integrity)
    assert npm.check_lock(spec)  # control: the lock as written passes
    lock = json.loads((spec / "package-lock.json").read_text())
    entry = lock["packages"][f"node_modules/{FAKE}"]
    for key, value in change.items():
        if value is None:
            del entry[key]
        else:
            entry[key] = value
    (spec / "package-lock.json").write_text(json.dumps(lock))
    with pytest.raises(UsageError, match=f"node_modules/{FAKE}: {message}"):
        npm.check_lock(spec)


def test_a_spec_without_a_lock_or_with_an_old_one_is_a_clear_error(tmp_path: Path) -> None:
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(b"x").digest()).decode()
    spec = _spec(tmp_path / "spec", "1.0.0", integrity)
    lock = json.loads((spec / "package-lock.json").read_text())
    (spec / "package-lock.json").write_text(json.dumps({**lock, "lockfileVersion": 1}))
    with pytest.raises(UsageError, match="lockfileVersion 2 or 3"):
        npm.check_lock(spec)
    (spec / "package-lock.json").unlink()
    with pytest.raises(UsageError, match="no package-lock.json"):
        npm.check_lock(spec)


def test_a_change_of_the_lock_changes_the_digest_and_the_cache_key(
    ex: Executor, fakes: Fakes, fake_env: environments.Environment
) -> None:
    two = fakes.build(ENV2, fakes.spec2)
    assert two.manifest["npm_packages"] == {FAKE: "2.0.0"}
    assert two.manifest["tree_digest"] != fake_env.manifest["tree_digest"]
    assert two.image.digest != fake_env.image.digest
    first = _js(ex, ANSWER)
    second = _js(ex, ANSWER, environment=ENV2)  # the same code: only the lock differs
    assert (first.stdout, second.stdout) == ("42\n", "49\n")
    assert second.image_digest == two.image.digest and not second.cached
    assert _js(ex, ANSWER, environment=ENV2).cached  # control: the cache is on


def test_minimal_refuses_npm_packages_and_still_denies_node_s_reach_outside(
    ex: Executor,
) -> None:
    result = _js(ex, ANSWER, profile="minimal")
    assert result.status is Status.policy_denied and result.error is not None
    assert result.error.rule == "js.dynamic" and FAKE in result.error.message
    for module in ("child_process", "net", "http", "worker_threads"):
        denied = _js(ex, f"require('{module}')", profile="minimal")
        assert denied.error is not None and denied.error.rule == "js.module_denied", module
    assert _js(ex, "console.log(6 * 7)", profile="minimal").stdout == "42\n"


def test_a_missing_package_names_the_environment_that_has_it(ex: Executor) -> None:
    for code in (ANSWER, ESM_ANSWER):
        result = _js(ex, code, environment=None, cache=False)
        assert result.error is not None, code
        hint = result.error.message.partition(f"(npm package {FAKE} is not in this run's ")[2]
        assert f"{ENV!r}" in hint and f"(run with --environment {ENV})" in hint, result.error
        assert result.error.message.startswith("Cannot find ")  # Node's own words first


# --- the shipped js-data set, from the npm registry ------------------------------------------

CURATED_VALUES = {
    "lodash": ("_.sum([1, 2, 3]) + _.chunk([1, 2, 3, 4, 5], 2).length", "9"),
    "date-fns": ("differenceInDays(new Date(2024, 2, 1), new Date(2024, 1, 1))", "29"),
    "mathjs": ("math.det([[1, 2], [3, 4]]).toFixed(6)", "-2.000000"),
    "papaparse": ("Papa.parse('a,b\\n1,2\\n3,4', { header: true }).data[1].b", "4"),
    "simple-statistics": ("ss.standardDeviation([2, 4, 4, 4, 5, 5, 7, 9])", "2"),
}
REQUIRES = (
    "const _ = require('lodash'); const { differenceInDays } = require('date-fns'); "
    "const math = require('mathjs'); const Papa = require('papaparse'); "
    "const ss = require('simple-statistics');\n"
)
IMPORTS = (
    "import _ from 'lodash'; import { differenceInDays } from 'date-fns';\n"
    "import * as math from 'mathjs'; import Papa from 'papaparse';\n"
    "import * as ss from 'simple-statistics';\n"
)


@pytest.fixture(scope="module")
def curated(fakes: Fakes) -> environments.Environment:
    try:
        return environments.build(
            CURATED,
            requirements=fakes.wheels / "requirements.txt",
            find_links=fakes.wheels,
            no_index=True,
            log=False,
            npm_spec=environments.SHIPPED_NPM["js-data"],
            npm_cache=fakes.root / "registry-cache",
        )
    except UsageError as exc:
        if any(
            e in str(exc)
            for e in ("ENOTFOUND", "EAI_AGAIN", "ETIMEDOUT", "ECONNREFUSED", "ENETUNREACH")
        ):
            pytest.skip(f"the npm registry is unreachable: {exc}")
        raise


@pytest.mark.slow
@pytest.mark.timeout(600)  # the first builds the set from the registry (about a minute)
@pytest.mark.parametrize("head", [REQUIRES, IMPORTS], ids=["require", "import"])
def test_each_curated_package_gives_its_known_value(
    ex: Executor, curated: environments.Environment, head: str
) -> None:
    lock = json.loads((environments.SHIPPED_NPM["js-data"] / "package-lock.json").read_text())
    assert curated.manifest["npm_packages"] == {
        name: lock["packages"][f"node_modules/{name}"]["version"] for name in CURATED_VALUES
    }
    for name in CURATED_VALUES:
        assert lock["packages"][f"node_modules/{name}"]["license"] in ("MIT", "ISC", "Apache-2.0")
    code = head + "".join(f"console.log({expr});\n" for expr, _ in CURATED_VALUES.values())
    # mathjs alone takes about 1 s of CPU to load: room for a loaded machine.
    result = _js(ex, code, environment=CURATED, limits={"timeout_s": 40})
    assert result.status is Status.ok, result
    assert result.stdout.split() == [value for _, value in CURATED_VALUES.values()]
    description = tools.describe_language("javascript", environment=CURATED)
    assert "lodash 4.18.1" in description and "mathjs 15.2.0" in description
    assert "no npm packages" in tools.describe_language("javascript")


def test_the_shipped_profiles_allow_js_data_except_minimal() -> None:
    from execbox.environments.build import SHIPPED, SHIPPED_NPM
    from execbox.policy import load_profiles

    shipped = load_profiles()
    assert "js-data" in shipped["data"].environments  # type: ignore[operator]
    assert "js-data" in shipped["extended"].environments  # type: ignore[operator]
    assert shipped["minimal"].environments is None  # the default only
    assert SHIPPED["js-data"] == SHIPPED["data"]  # data's Python packages, and the npm set
    assert npm.check_lock(SHIPPED_NPM["js-data"])
