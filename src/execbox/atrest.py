"""Secrets at rest: what a run's record keeps of its request.

A record keeps the code, stdin, environment and input files, to explain and replay the run.
None of them keeps a secret in clear: the code, stdin and environment values pass the run's
`Redactor` (registered values and known formats, as the output does); input files, which are
data and often binary, are searched for the registered values (and their escaped forms) only
(a pattern pass over megabytes of binary data would cost seconds and could mangle it).

A sealed part keeps a digest of its original and one per redacted span (`Hole`), so that a
caller who gives the secrets again gets the exact request back, checked against them, and
nobody else does. Those digests are HMAC-SHA256 under the store's key (`RunStore.keyed`,
kept outside the database): a plain sha256 would let anyone who reads the records test
guesses of a short secret (a PIN) offline. For the same reason a run's `code_sha256` (in the
result as returned, streamed and stored, and in the record's column) is the sha256 of the code
as stored, redacted (`seal_code`).

The `sealed` column of a record says what was redacted:

    {"digest": "hmac-sha256", "code": HOLES, "code_digest": D,
     "stdin": {"blob": SHA, "digest": D, "holes": HOLES},
     "env": {NAME: {"digest": D, "holes": HOLES}},
     "inputs": {NAME: {"blob": SHA, "digest": D, "holes": HOLES}}}

(each part only when something was redacted; HOLES: [[offset, kind, D], ...], with the
piece's length after D for a start or an end of a registered value alone; D: a keyed
digest of the original; "blob" names the redacted bytes kept in the blob table).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .contract import InputFile, RunRequest
from .errors import UsageError
from .redact import Hole, Redactor, refill

__all__ = ["SealedCode", "Stored", "seal", "seal_code", "unseal"]


Digest = Callable[[bytes], str]
KEYED = "hmac-sha256"  # the `digest` of a sealed record


@dataclass(frozen=True, slots=True)
class Stored:
    """A request as its record keeps it: `request` redacted, the sha256 of its stdin and
    inputs as stored (the blobs' names), and what was sealed."""

    request: RunRequest
    stdin_sha256: str
    input_sha256: tuple[str, ...]
    sealed: dict[str, Any] | None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _holes(holes: list[Hole]) -> list[list[Any]]:
    return [
        [h.at, h.kind, h.digest] if h.length is None else [h.at, h.kind, h.digest, h.length]
        for h in holes
    ]


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


@dataclass(frozen=True, slots=True)
class SealedCode:
    """A request's code as its record keeps it: `text` with what the run's `Redactor` finds
    redacted (the code itself when nothing is), a `Hole` per redacted span, and `sha256`, the
    run's `code_sha256`: the sha256 of `text`. The original's digest would let anyone holding
    the result test guesses of a secret in the code offline."""

    text: str
    holes: list[Hole]
    sha256: str


def seal_code(code: str, redactor: Redactor, digest: Digest) -> SealedCode:
    """`code` sealed as `seal` seals it, once a run: its result's `code_sha256` and its
    record are made from the same pass over the code (see `seal`'s `code`)."""
    text, holes = redactor.seal(code, digest)
    return SealedCode(text, holes, _sha256(_utf8(text)))


def _seal_bytes(redactor: Redactor, data: bytes, digest: Digest) -> tuple[bytes, list[Hole]]:
    # surrogateescape keeps bytes that are not UTF-8 as they are, through redaction and back.
    text, holes = redactor.seal(data.decode("utf-8", "surrogateescape"), digest)
    return (_utf8(text), holes) if holes else (data, [])


def seal(
    request: RunRequest, redactor: Redactor, digest: Digest, code: SealedCode | None = None
) -> Stored:
    """What the record of `request` keeps, with everything `redactor` finds redacted and
    `digest` (keyed) of each original that held a secret. `code`: `request.code` already
    sealed by `seal_code` with the same redactor and digest."""
    sealed: dict[str, Any] = {}
    if code is None:
        code = seal_code(request.code, redactor, digest)
    if code.holes:
        sealed["code"] = _holes(code.holes)
        sealed["code_digest"] = digest(_utf8(request.code))
    stdin, holes = _seal_bytes(redactor, request.stdin, digest) if request.stdin else (b"", [])
    if holes:
        sealed["stdin"] = {
            "blob": _sha256(stdin),
            "digest": digest(request.stdin),
            "holes": _holes(holes),
        }
    env: dict[str, str] = {}
    for name, value in request.env.items():
        env[name], holes = redactor.seal(value, digest)
        if holes:
            sealed.setdefault("env", {})[name] = {
                "digest": digest(_utf8(value)),
                "holes": _holes(holes),
            }
    files: list[InputFile] = []
    registered = redactor.registered_only() if redactor.secrets else None
    for f in request.files:
        data = f.data
        if registered is not None:  # one pass over the file for every form of every value
            data, holes = _seal_bytes(registered, data, digest)
            if holes:
                sealed.setdefault("inputs", {})[f.name] = {
                    "blob": _sha256(data),
                    "digest": digest(f.data),
                    "holes": _holes(holes),
                }
        files.append(f if data is f.data else InputFile(name=f.name, data=data))
    if not sealed:
        return Stored(
            request, _sha256(request.stdin), tuple(_sha256(f.data) for f in request.files), None
        )
    sealed["digest"] = KEYED
    stored = request.model_copy(
        update={"code": code.text, "stdin": stdin, "env": env, "files": files}
    )
    return Stored(stored, _sha256(stdin), tuple(_sha256(f.data) for f in files), sealed)


def unseal(
    run_id: str, sealed: dict[str, Any], stored: RunRequest, digest: Digest, secrets: Iterable[str]
) -> RunRequest:
    """The original request of a sealed record, its redacted parts refilled with `secrets`
    and checked against the originals' keyed digests (`digest`: the store's);
    UsageError saying what is missing and how to give it otherwise."""
    if sealed.get("digest") != KEYED:
        raise UsageError(
            f"run {run_id} was recorded by an older execbox, whose record of "
            "its secrets this one does not read; it cannot be run again"
        )
    values = [s for s in secrets if s]
    missing: list[str] = []

    def fill(what: str, text: str, holes: list[list[Any]], want: str) -> str:
        out, unfilled = refill(text, [Hole(*h) for h in holes], values, digest)
        if unfilled or digest(_utf8(out)) != want:
            missing.append(what)
        return out

    code = stored.code
    if "code" in sealed:
        code = fill("its code", code, sealed["code"], sealed["code_digest"])
    stdin = stored.stdin
    if "stdin" in sealed:
        stdin = _utf8(
            fill(
                "its stdin",
                stdin.decode("utf-8", "surrogateescape"),
                sealed["stdin"]["holes"],
                sealed["stdin"]["digest"],
            )
        )
    env = dict(stored.env)
    for name, meta in sealed.get("env", {}).items():
        env[name] = fill(f"environment value {name}", env[name], meta["holes"], meta["digest"])
    files = []
    for f in stored.files:
        meta = sealed.get("inputs", {}).get(f.name)
        if meta is not None:
            data = fill(
                f"input file {f.name}",
                f.data.decode("utf-8", "surrogateescape"),
                meta["holes"],
                meta["digest"],
            )
            f = InputFile(name=f.name, data=_utf8(data))
        files.append(f)
    if missing:
        given = "the secrets given do not restore" if values else "no secrets were given for"
        raise UsageError(
            f"run {run_id} cannot be run again exactly: {', '.join(missing)} held secrets, "
            f"which its record keeps redacted (with the sha256 of each), and {given} them; "
            f"give the secret values again (`--secret VALUE`, once per secret; Python: "
            f"secrets=[...])"
        )
    return stored.model_copy(update={"code": code, "stdin": stdin, "env": env, "files": files})
