"""A run's compact form on its way to a node's host (`execbox.cluster.wire`): every option
and limit a caller sets arrives as set, defaults arrive as defaults, and what stays with the
caller (callbacks, cancel token, spool directory) never leaves it."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

from execbox import Cancel
from execbox.backend import RunSpec
from execbox.cluster.wire import CALLER_ONLY, pack, unpack
from execbox.contract import Limits
from execbox.network.allowlist import Entry
from execbox.network.secrets import Binding

SET: dict[str, Any] = {
    "kind": "heavy",
    "env": {"A": "1"},
    "files": [("in.csv", b"a,b\n")],
    "stdin": b"typed",
    "tenant": "acme",
    "network": ["example.com:443"],
    "bound": [
        Binding("KEY", "sekrit", "PLACEHOLDER", (Entry("example.com", "example.com", None, None),))
    ],
    "environment": "sha256:abc",
    "language": "javascript",
}


def test_every_option_set_arrives_as_set() -> None:
    names = {f.name for f in dataclasses.fields(RunSpec)} - CALLER_ONLY
    assert names == {"run_id", "code", "limits", *SET}, "a RunSpec field this test does not set"
    limits = Limits(timeout_s=2, cpu_s=1.5, memory_mib=128, pids=16, output_bytes=4096)
    spec = RunSpec(run_id="r1", code="print(1)", limits=limits, **SET)
    assert unpack(pickle.loads(pickle.dumps(pack(spec)))) == spec


def test_defaults_arrive_as_defaults_and_the_callers_own_stays() -> None:
    spec = RunSpec(
        run_id="r2",
        code="pass",
        limits=Limits(),
        on_stdout=print,
        on_stderr=print,
        cancel=Cancel(),
        spool_dir="/nowhere",
    )
    packed = pack(spec)
    assert packed == ("r2", "pass", {}, {})
    assert unpack(packed) == dataclasses.replace(
        spec, on_stdout=None, on_stderr=None, cancel=None, spool_dir=None
    )
