"""Secrets at rest: what a run's record keeps of its request.

A record keeps the code, stdin, environment and input files, to explain and replay the run.
None of them keeps a secret in clear: the code, stdin and environment values pass the run's
`Redactor` (registered values and known formats, as the output does); input files, which are
data and often binary, are searched for the registered values (and their escaped forms) only
(a pattern pass over megabytes of binary data would cost seconds and could mangle it). The
sha256 of each original stays in the record (`code_sha256`, `stdin_sha256`, each input's
`sha256`, and per redacted environment value), with one sha256 per redacted span (`Hole`), so
that a caller who gives the secrets again gets the exact request back, checked against those
digests, and nobody else does.

The `sealed` column of a record says what was redacted:

    {"code": HOLES, "stdin": {"blob": SHA, "holes": HOLES},
     "env": {NAME: {"sha256": SHA, "holes": HOLES}}, "inputs": {NAME: {"blob": SHA, "holes": HOLES}}}

(each key only when something was redacted; HOLES: [[offset, kind, sha256], ...]; "blob" names
the redacted bytes kept in the blob table).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .contract import InputFile, RunRequest
from .errors import UsageError
from .redact import Hole, Redactor, refill

__all__ = ["Stored", "seal", "unseal"]


@dataclass(frozen=True, slots=True)
class Stored:
    """A request as its record keeps it: `request` redacted, the originals' digests (the
    code's is the result's `code_sha256`, computed once per run)."""

    request: RunRequest
    stdin_sha256: str
    input_sha256: tuple[str, ...]
    sealed: dict[str, Any] | None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _holes(holes: list[Hole]) -> list[list[Any]]:
    return [[h.at, h.kind, h.sha256] for h in holes]


def _seal_bytes(redactor: Redactor, data: bytes) -> tuple[bytes, list[Hole]]:
    # surrogateescape keeps bytes that are not UTF-8 as they are, through redaction and back.
    text, holes = redactor.seal(data.decode("utf-8", "surrogateescape"))
    return (text.encode("utf-8", "surrogateescape"), holes) if holes else (data, [])


def seal(request: RunRequest, redactor: Redactor) -> Stored:
    """What the record of `request` keeps, with everything `redactor` finds redacted."""
    sealed: dict[str, Any] = {}
    code, holes = redactor.seal(request.code)
    if holes:
        sealed["code"] = _holes(holes)
    stdin, holes = _seal_bytes(redactor, request.stdin) if request.stdin else (b"", [])
    if holes:
        sealed["stdin"] = {"blob": _sha256(stdin), "holes": _holes(holes)}
    env: dict[str, str] = {}
    for name, value in request.env.items():
        env[name], holes = redactor.seal(value)
        if holes:
            sealed.setdefault("env", {})[name] = {
                "sha256": _sha256(value.encode("utf-8", "surrogateescape")),
                "holes": _holes(holes)}
    files: list[InputFile] = []
    registered = redactor.registered_only() if redactor.secrets else None
    for f in request.files:
        data = f.data
        if registered is not None:  # one pass over the file for every form of every value
            data, holes = _seal_bytes(registered, data)
            if holes:
                sealed.setdefault("inputs", {})[f.name] = {"blob": _sha256(data),
                                                           "holes": _holes(holes)}
        files.append(f if data is f.data else InputFile(name=f.name, data=data))
    stored = request.model_copy(update={"code": code, "stdin": stdin, "env": env,
                                        "files": files}) if sealed else request
    return Stored(stored, _sha256(request.stdin),
                  tuple(_sha256(f.data) for f in request.files), sealed or None)


def unseal(run_id: str, sealed: dict[str, Any], stored: RunRequest, digests: dict[str, str],
           secrets: Iterable[str]) -> RunRequest:
    """The original request of a sealed record, its redacted parts refilled with `secrets`
    and checked against the originals' sha256 (`digests`: "code", "stdin", "input:NAME");
    UsageError saying what is missing and how to give it otherwise."""
    values = [s for s in secrets if s]
    missing: list[str] = []

    def fill(what: str, text: str, holes: list[list[Any]], sha: str) -> str:
        out, unfilled = refill(text, [Hole(*h) for h in holes], values)
        if unfilled or _sha256(out.encode("utf-8", "surrogateescape")) != sha:
            missing.append(what)
        return out

    code = stored.code
    if "code" in sealed:
        code = fill("its code", code, sealed["code"], digests["code"])
    stdin = stored.stdin
    if "stdin" in sealed:
        stdin = fill("its stdin", stdin.decode("utf-8", "surrogateescape"),
                     sealed["stdin"]["holes"], digests["stdin"]).encode("utf-8", "surrogateescape")
    env = dict(stored.env)
    for name, meta in sealed.get("env", {}).items():
        env[name] = fill(f"environment value {name}", env[name], meta["holes"], meta["sha256"])
    files = []
    for f in stored.files:
        meta = sealed.get("inputs", {}).get(f.name)
        if meta is not None:
            data = fill(f"input file {f.name}", f.data.decode("utf-8", "surrogateescape"),
                        meta["holes"], digests[f"input:{f.name}"])
            f = InputFile(name=f.name, data=data.encode("utf-8", "surrogateescape"))
        files.append(f)
    if missing:
        given = "the secrets given do not restore" if values else "no secrets were given for"
        raise UsageError(
            f"run {run_id} cannot be run again exactly: {', '.join(missing)} held secrets, "
            f"which its record keeps redacted (with the sha256 of each), and {given} them; "
            f"give the secret values again (`--secret VALUE`, once per secret; Python: "
            f"secrets=[...])")
    return stored.model_copy(update={"code": code, "stdin": stdin, "env": env, "files": files})
