"""No host path in the jail: the runtime image appears at `image.ENV_DIR` and execbox's in-image
package at `image.PACKAGE_DIR`, whatever their host paths are.

Each test reads the real host paths here (this run's EXECBOX_HOME, the image's tree, execbox's
source checkout, this interpreter's venv) and asserts that none of them shows in what a real
run sees: the interpreter's own paths, every module's file, every function's code file, a
traceback through the runner, /proc/self/{mountinfo,maps,environ,cgroup,cmdline} and listings.
"""

from __future__ import annotations

import json
import os
import pwd
import sys
import sysconfig
from pathlib import Path

import pytest

import execbox
from execbox import Executor, Status
from execbox.environments.tree import own_prefixes
from execbox.image import ENV_DIR, PACKAGE_DIR, Image, home

# Everything a run can learn about where its interpreter, its modules and execbox live.
PROBE = r"""
import gc, io, json, os, site, sys, sysconfig, traceback, types
import matplotlib.font_manager, numpy
gc.unfreeze()  # the zygote's frozen heap too: every function it loaded
facts = {
    "prefix": [sys.prefix, sys.base_prefix, sys.exec_prefix],
    "executable": sys.executable,
    "path": sys.path,
    "sysconfig": sysconfig.get_paths(),
    "site": site.getsitepackages(),
    "numpy": numpy.__file__,
    "config_vars": {k: str(v) for k, v in sysconfig.get_config_vars().items()},
    "user_site": [site.USER_SITE, site.USER_BASE, site.getuserbase(), site.getusersitepackages()],
    "font_dirs": matplotlib.font_manager.X11FontDirectories,
    "modules": sorted({str(getattr(m, "__file__", "")) for m in list(sys.modules.values())}),
    "code_files": sorted(
        {o.__code__.co_filename for o in gc.get_objects() if isinstance(o, types.FunctionType)}
    ),
}
stack = io.StringIO()
traceback.print_stack(file=stack)  # through the runner's own frames
facts["stack"] = stack.getvalue()
for name in ("mountinfo", "maps", "environ", "cgroup", "cmdline"):
    try:
        with open(f"/proc/self/{name}", "rb") as fh:
            facts[name] = fh.read().decode("latin-1")
    except OSError as exc:  # a non-dumpable process's environ
        facts[name] = type(exc).__name__
facts["listings"] = {}
for d in ("/", "/root", "/home", "/opt", "/tmp", "/run", "/run/execbox", "/run/execbox/env"):
    try:
        facts["listings"][d] = sorted(os.listdir(d))
    except OSError as exc:
        facts["listings"][d] = type(exc).__name__
print(json.dumps(facts))
"""
# The jail's root: nothing else is in it.
JAIL_ROOT = {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "run", "sbin"}
JAIL_ROOT |= {"tmp", "usr", "workspace"}


def host_paths() -> dict[str, str]:
    """The host paths a run must not learn, each as this host has it."""
    paths = {
        "EXECBOX_HOME": str(home()),
        "resolved EXECBOX_HOME": str(home().resolve()),
        "image tree": str(Image.load().root),
        "execbox checkout": str(Path(execbox.__file__).resolve().parent.parent),
    }
    if sys.prefix != sys.base_prefix:  # a venv: execbox's own interpreter install
        paths["host venv"] = sys.prefix
    return paths


def host_install_and_home() -> dict[str, str]:
    """The host interpreter's build prefixes (which an environment's tree was copied from) and
    the home of the user running execbox, as this host has them."""
    paths = {
        "host home": os.path.expanduser("~"),
        "host passwd home": pwd.getpwuid(os.getuid()).pw_dir,
    }
    prefixes = [sysconfig.get_config_var(v) for v in ("prefix", "exec_prefix")]
    for prefix in own_prefixes([str(p) for p in prefixes]):
        paths[f"host build prefix {prefix}"] = prefix
    return {what: path for what, path in paths.items() if path not in ("", "/")}


def _at_env(path: str) -> bool:
    return path == ENV_DIR or path.startswith(ENV_DIR + "/")


def assert_no_host_path(seen: str) -> None:
    for what, path in host_paths().items():
        assert path not in seen, f"{what} ({path}) is visible in the jail"


@pytest.fixture(scope="module")
def facts(jailed: Executor) -> dict[str, object]:
    r = jailed.run(PROBE, limits={"timeout_s": 30, "memory_mib": 1024})
    assert r.status is Status.ok, (r.error, r.stderr[-3000:])
    facts: dict[str, object] = json.loads(r.stdout)
    return facts


def test_the_interpreter_lives_at_the_fixed_path(facts: dict[str, object]) -> None:
    assert facts["prefix"] == [ENV_DIR] * 3
    assert str(facts["executable"]).startswith(ENV_DIR + "/bin/")
    paths = facts["path"]
    assert isinstance(paths, list) and paths
    assert all(p == "/workspace" or p.startswith(ENV_DIR + "/") for p in paths), paths
    sysconfig_paths = facts["sysconfig"]
    assert isinstance(sysconfig_paths, dict)
    assert all(_at_env(str(p)) for p in sysconfig_paths.values()), sysconfig_paths
    site_dirs = facts["site"]
    assert isinstance(site_dirs, list) and site_dirs
    assert all(_at_env(str(p)) for p in site_dirs), site_dirs
    assert str(facts["numpy"]).startswith(ENV_DIR + "/lib/")
    assert_no_host_path(json.dumps([facts[k] for k in ("prefix", "executable", "path")]))
    assert_no_host_path(json.dumps([facts[k] for k in ("sysconfig", "site", "numpy")]))


def test_module_and_code_files_and_the_runners_frames_name_no_host_path(
    facts: dict[str, object],
) -> None:
    code_files = facts["code_files"]
    assert isinstance(code_files, list)
    runner = f"{PACKAGE_DIR}/execbox/sandbox/inside/runner.py"
    assert runner in code_files  # the positive control: execbox's own code is there
    assert runner in str(facts["stack"])
    assert_no_host_path(json.dumps([facts["modules"], code_files, facts["stack"]]))


def test_proc_files_name_no_host_path(facts: dict[str, object]) -> None:
    for name in ("mountinfo", "maps", "environ", "cgroup", "cmdline"):
        assert_no_host_path(str(facts[name]))
    assert f"{ENV_DIR}/bin/python" in str(facts["maps"])  # mapped from the fixed path
    # The image is a filesystem of its own: the mount's root within it (field 4) is "/", not
    # the directory it was made from, as a bind of that directory would show.
    lines = [ln.split() for ln in str(facts["mountinfo"]).splitlines()]
    env = [fields for fields in lines if fields[4] == ENV_DIR]
    assert len(env) == 1 and env[0][3] == "/", env
    assert "ro" in env[0][5].split(","), env


def test_listings_show_no_host_directory(facts: dict[str, object]) -> None:
    listings = facts["listings"]
    assert isinstance(listings, dict)
    assert set(listings["/"]) <= JAIL_ROOT, listings["/"]
    for missing in ("/root", "/home", "/opt"):
        assert listings[missing] == "FileNotFoundError", (missing, listings[missing])
    assert listings["/run"] == ["execbox"] and listings["/run/execbox"] == ["env"]
    assert "lib" in listings["/run/execbox/env"]
    assert_no_host_path(json.dumps(listings))


def test_a_traceback_names_only_the_fixed_paths(jailed: Executor) -> None:
    r = jailed.run("import json\n\ndef parse():\n    return json.loads('{')\n\nparse()\n")
    assert r.status is Status.error and r.error is not None
    assert r.error.type == "JSONDecodeError"
    assert r.error.traceback is not None
    assert f'File "{ENV_DIR}/lib/python3.' in r.error.traceback  # through the stdlib's frames
    assert_no_host_path(r.error.traceback + r.stderr)


def test_the_build_configuration_names_the_fixed_path_not_the_hosts_install(
    facts: dict[str, object],
) -> None:
    config = facts["config_vars"]
    assert isinstance(config, dict)
    assert config["LIBDIR"] == f"{ENV_DIR}/lib", config["LIBDIR"]
    for what, path in host_install_and_home().items():
        named = {k: v for k, v in config.items() if path in v}
        assert not named, f"{what} ({path}) is in the jail's config vars: {named}"
    assert_no_host_path(json.dumps(config))


def test_user_site_and_font_dirs_name_the_jails_home_not_the_hosts(
    facts: dict[str, object],
) -> None:
    user_site, font_dirs = facts["user_site"], facts["font_dirs"]
    assert isinstance(user_site, list) and isinstance(font_dirs, list) and font_dirs
    assert all(str(p).startswith("/workspace/") for p in user_site), user_site
    seen = json.dumps([user_site, font_dirs])
    for what, path in host_install_and_home().items():
        assert path not in seen, f"{what} ({path}) is visible in the jail: {seen}"
