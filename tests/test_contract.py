"""The contract's field names, status values and validation are what other code relies on."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

import execbox
from execbox.contract import InputFile, Limits, RunRequest, RunResult, Status, schema

RESULT_FIELDS = {
    "run_id",
    "status",
    "exit_code",
    "signal",
    "stdout",
    "stderr",
    "stdout_truncated",
    "stderr_truncated",
    "error",
    "artifacts",
    "artifacts_truncated",
    "inputs_read",
    "metrics",
    "limits",
    "unenforced_limits",
    "code_sha256",
    "image_digest",
    "cached",
    "session_id",
    "outputs",
    "network_log",
}
STATUSES = {
    "ok",
    "error",
    "timeout",
    "cpu_limit",
    "memory_limit",
    "disk_limit",
    "output_limit",
    "forbidden",
    "policy_denied",
    "needs_approval",
    "budget_exceeded",
    "sandbox_error",
    "network_limit",
}


def test_result_json_has_exactly_the_contract_fields() -> None:
    data = json.loads(RunResult(run_id="r", status=Status.ok).model_dump_json())
    assert set(data) == RESULT_FIELDS
    assert set(data["metrics"]) == {"wall_ms", "cpu_ms", "memory_peak_bytes", "node"}


def test_status_values_are_the_contract_values() -> None:
    assert {s.value for s in Status} == STATUSES


def test_default_limits_follow_the_seed_baseline() -> None:
    limits = Limits()
    assert (limits.timeout_s, limits.effective_cpu_s, limits.memory_mib, limits.pids) == (
        5,
        5,
        512,
        64,
    )
    assert (limits.disk_mib, limits.output_bytes) == (100, 1 << 20)
    assert (limits.artifact_bytes, limits.artifact_files) == (10 << 20, 100)


def test_artifact_bytes_stay_out_of_json() -> None:
    art = execbox.Artifact(path="a.txt", size=1, sha256="0" * 64, mime_type="text/plain", data=b"x")
    assert "data" not in json.loads(art.model_dump_json())


@pytest.mark.parametrize(
    "name", ["../x", "/etc/passwd", "a//b", "a/./b", "", "a/../b", "x\x00y", "a" * 256]
)
def test_input_names_that_could_escape_are_rejected(name: str) -> None:
    with pytest.raises(ValidationError):
        InputFile(name=name, data=b"")


def test_code_with_a_lone_surrogate_is_rejected_with_its_line() -> None:
    # JSON as the standard library (and so FastAPI) decodes it can carry one ("\\udcff"); it
    # cannot be run, recorded or hashed as UTF-8.
    body = json.loads('{"code": "x = 1\\ny = \\"\\udcff\\""}')
    with pytest.raises(ValidationError, match="lone surrogate .* on line 2"):
        RunRequest.model_validate(body)
    from execbox.request import make_request

    with pytest.raises(execbox.UsageError, match="lone surrogate"):
        make_request("x = '\udcff'")


def test_input_file_used_as_directory_is_rejected() -> None:
    with pytest.raises(ValidationError, match="both as file and directory"):
        RunRequest(code="", files=[InputFile(name="a", data=b""), InputFile(name="a/b", data=b"")])


def test_request_round_trips_through_json_with_base64_bytes() -> None:
    req = RunRequest(
        code="print(1)", stdin=b"\xff\x00", files=[InputFile(name="d/x.bin", data=b"\x00\xff")]
    )
    again = RunRequest.model_validate_json(req.model_dump_json())
    assert again == req


def test_unknown_limit_fields_are_rejected() -> None:
    with pytest.raises(ValidationError):
        Limits(timeout=3)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    "field,value",
    [("timeout_s", 0), ("memory_mib", 1), ("pids", 1), ("disk_mib", 0), ("output_bytes", 10)],
)
def test_nonsense_limits_are_rejected(field: str, value: float) -> None:
    with pytest.raises(ValidationError):
        Limits(**{field: value})


def test_env_names_with_equals_are_rejected() -> None:
    with pytest.raises(ValidationError):
        RunRequest(code="", env={"A=B": "1"})


def test_schema_covers_request_and_result() -> None:
    s = schema()
    assert set(s["RunResult"]["properties"]) == RESULT_FIELDS
    assert "code" in s["RunRequest"]["properties"]
    json.dumps(s)


def test_public_surface_matches_all() -> None:
    for name in execbox.__all__:
        assert getattr(execbox, name) is not None
    with pytest.raises(AttributeError):
        execbox.not_a_thing  # noqa: B018


def test_sandbox_package_imports_without_execbox_dependencies() -> None:
    """The zygote imports execbox.sandbox inside the runtime image, where pydantic is absent."""
    import subprocess
    import sys
    from pathlib import Path

    src = Path(execbox.__file__).resolve().parent.parent
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "import execbox.sandbox.inside.zygote, execbox.sandbox.inside.supervisor; "
        "bad = [m for m in ('pydantic', 'click', 'execbox.contract') if m in sys.modules]; "
        "sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-I", "-c", code, str(src)]).returncode == 0


def test_committed_schema_file_is_up_to_date() -> None:
    from pathlib import Path

    committed = Path(__file__).parents[1] / "docs" / "contract.schema.json"
    assert json.loads(committed.read_text()) == json.loads(json.dumps(schema())), (
        "regenerate with: execbox schema -o docs/contract.schema.json"
    )


# Source bytes CPython itself refuses, each with the line of the first byte that does not
# decode, or of the coding cookie that is wrong.
UNDECODABLE_SOURCES = [
    (b"\xff\n", 1),
    (b"x = 1\ny = 'a\xffb'\n", 2),
    (b"x = 1  # \xe9 in a comment\n", 1),
    ("x = 'é'\n\n\nz = 1\n".encode() + b"w = '\xc3('\n", 5),
    (b"\xef\xbb\xbfx = 1\n\xff\n", 2),
    (b"# coding: ascii\nx = 1\ny = '\xe9'\n", 3),
    (b"x = 1\n# coding: latin-1\n\xe9 = 2\n", 3),  # a cookie below code is no cookie
    (b"\xff\n# coding: latin-1\n", 1),
    (b"\n# coding: no-such-codec\nx = 1\n", 2),
    (b"\xef\xbb\xbf# coding: latin-1\nx = 1\n", 1),  # a BOM says UTF-8: a cookie may not differ
]


def _cpython_verdict(source: bytes, tmp_path: Path) -> tuple[bool, int | None]:
    """Whether CPython runs `source` as a file, and the line it names when it does not."""
    path = tmp_path / "main.py"
    path.write_bytes(source)
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, timeout=60)
    if proc.returncode == 0:
        return True, None
    assert b"SyntaxError" in proc.stderr, proc.stderr
    found = re.search(rb"line (\d+)", proc.stderr)
    return False, int(found.group(1)) if found else None


@pytest.mark.parametrize("source,line", UNDECODABLE_SOURCES)
def test_undecodable_source_is_cpythons_syntax_error_on_its_line(
    source: bytes, line: int, tmp_path: Path
) -> None:
    ran, cpython_line = _cpython_verdict(source, tmp_path)
    assert not ran and cpython_line in (line, None)  # None: CPython names no line; we do
    request = RunRequest(code=source)  # a request all the same, never a validation error
    error = request.source_error
    assert isinstance(error, SyntaxError) and error.lineno == line
    assert error.msg and ("codec" in error.msg or "encoding" in error.msg)


def test_column_of_an_undecodable_byte_counts_characters() -> None:
    error = RunRequest(code="s = 'é'; t = '".encode() + b"\xff'\n").source_error
    assert error is not None and (error.lineno, error.offset) == (1, 15)
    assert error.text == "s = 'é'; t = '\ufffd'\n"


@pytest.mark.parametrize(
    "source,text",
    [
        (
            b"# -*- coding: latin-1 -*-\nprint('caf\xe9')\n",
            "# -*- coding: latin-1 -*-\nprint('café')\n",
        ),
        (
            b"#!/usr/bin/env python\n# vim: set fileencoding=cp1252 :\nx = '\x80'\n",
            "#!/usr/bin/env python\n# vim: set fileencoding=cp1252 :\nx = '€'\n",
        ),
        (b"\xef\xbb\xbfprint('bom')\n", "print('bom')\n"),
        ("print('é')\n".encode(), "print('é')\n"),
    ],
)
def test_source_bytes_decode_as_cpython_decodes_a_file(
    source: bytes, text: str, tmp_path: Path
) -> None:
    assert _cpython_verdict(source, tmp_path) == (True, None)  # CPython runs each of them
    request = RunRequest(code=source)
    assert request.source_error is None and request.code == text


def test_a_text_request_runs_none_of_pydantics_python_and_copies_keep_a_source_error() -> None:
    """Validating, copying and asking a text request for its source error calls no Python
    function of pydantic's (a private attribute set up for every request cost ~4 us of the
    caller's ~10 us); an undecodable source's SyntaxError survives the pipeline's copies."""
    called: list[str] = []

    def profile(frame: Any, event: str, _arg: Any) -> None:
        if event == "call" and "/pydantic/_internal/" in frame.f_code.co_filename:
            called.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        request = RunRequest.model_validate({"code": "print(1)", "limits": Limits()})
        copy = request.model_copy(update={"limits": Limits(timeout_s=2)})
        errors = (request.source_error, copy.source_error)
    finally:
        sys.setprofile(None)
    assert called == [] and errors == (None, None)
    undecodable = RunRequest(code=b"x = 1\n\xff\n")
    copy = undecodable.model_copy(update={"limits": Limits(timeout_s=2)})
    assert copy.source_error is undecodable.source_error
    assert isinstance(copy.source_error, SyntaxError) and copy.source_error.lineno == 2
    assert "source_error" not in undecodable.model_dump() and copy.code == "x = 1\n\\xff\n"


def test_run_ids_are_distinct_uuid4_hex() -> None:
    """Clients may parse a run id as a UUID: each is a version-4, RFC 4122 one in 32 hex
    digits, as `uuid.uuid4().hex` gives, and no two are alike."""
    import uuid

    from execbox.request import new_run_id

    ids = [new_run_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for run_id in ids:
        parsed = uuid.UUID(hex=run_id)
        assert parsed.hex == run_id
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
