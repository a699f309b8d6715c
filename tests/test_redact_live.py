"""Live output is redacted like the result: a secret split across two writes is caught on every
face (the callbacks, `astream`, the CLI's live output; the server's events are tested in
tests/server), the held text is released at the end of the run on every path, and the
concatenated live text is exactly the result's redacted output."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from execbox import Executor, Status
from execbox.redact import Redactor
from execbox.redact.live import PEM_HOLD_CHARS, LiveRedactor
from tests.splits import OUTPUT_BYTES, REGISTERED, SAMPLES, leaked, program

REDACTOR = Redactor(REGISTERED)


def _live(chunks: list[bytes], redactor: Redactor = REDACTOR) -> str:
    out: list[bytes] = []
    live = LiveRedactor(redactor, out.append)
    for chunk in chunks:
        live.write(chunk)
    live.close()
    return b"".join(out).decode()


def test_every_split_of_every_secret_is_caught_and_matches_the_whole() -> None:
    for sample in SAMPLES:
        data = ("before " + sample + " after\n").encode()
        want = REDACTOR.redact(data.decode())
        for k in range(1, len(data)):
            got = _live([data[:k], data[k:]])
            assert got == want, (sample[:20], k)
            assert not leaked(got)


def test_live_text_equals_the_whole_redaction_however_the_writes_are_cut() -> None:
    pieces = [
        *SAMPLES,
        "\n",
        "\r",
        "\r\n",
        " ",
        "\\n",
        "hello, world",
        "Comment: a, b",
        "-----BEGIN RSA PRIVATE KEY-----",
        "-----END RSA PRIVATE KEY-----",
        "MIIEowIBAAKCAQEAxyz0123456789ab",
        "api_key = '",
        "[REDACTED:secret]",
        "é",
        "€",
        # starts and ends of values shown cut short, with a mark or none
        "...",
        REGISTERED[0][:15] + "...",
        REGISTERED[2][:14] + "\u2026",
        repr(REGISTERED[2])[1:16] + "...",
        REGISTERED[0][:12] + " [...]",
        REGISTERED[1][-11:],
        REGISTERED[2][-13:],
        "(more)",
        REGISTERED[0][:9],
    ]
    rng = random.Random(27)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 20)))
        data = text.encode()
        cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(0, 8))))
        chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        assert _live(chunks) == REDACTOR.redact(text), text


def test_a_partial_line_is_held_until_its_line_ends_or_the_stream_closes() -> None:
    out: list[bytes] = []
    live = LiveRedactor(Redactor(REGISTERED[:2]), out.append)  # none spans lines: no hold-back
    live.write(b"progress 1\rprogress 2\rkey " + REGISTERED[0][:5].encode())
    assert b"".join(out) == b"progress 1\rprogress 2\r"  # \r-redrawn lines stay live
    live.write(REGISTERED[0][5:].encode())
    live.close()
    assert b"".join(out).decode() == "progress 1\rprogress 2\rkey [REDACTED:secret]"


def test_a_pem_key_is_held_whole_until_a_line_that_cannot_belong_to_it() -> None:
    pem = next(s for s in SAMPLES if "PRIVATE KEY" in s)
    begin, *body = pem.split("\n")[:-1]
    out: list[bytes] = []
    live = LiveRedactor(Redactor(REGISTERED[:2]), out.append)
    live.write(f"{begin}\n{body[0]}\n".encode())
    assert out == []  # without its END line the key may go on
    live.write(("\n".join(body[1:]) + "\nnext line, not base64\n").encode())
    assert b"".join(out).decode() == "[REDACTED:private_key]\nnext line, not base64\n"


@pytest.fixture(scope="module")
def split_run(executor: Executor) -> tuple[Executor, str]:
    return executor, program()


def test_callbacks_never_see_a_split_secret(split_run: tuple[Executor, str]) -> None:
    executor, code = split_run
    out: list[bytes] = []
    err: list[bytes] = []
    result = executor.run(
        program("stdout", "stderr"),
        secrets=REGISTERED,
        on_stdout=out.append,
        on_stderr=err.append,
        limits={"output_bytes": OUTPUT_BYTES, "timeout_s": 60},
    )
    assert result.status is Status.ok, result.error
    live_out, live_err = b"".join(out).decode(), b"".join(err).decode()
    assert not leaked(live_out) and not leaked(live_err)
    assert live_out == result.stdout and live_err == result.stderr
    assert result.stdout.count("[REDACTED:") >= sum(len(s.encode()) - 1 for s in SAMPLES)


def test_astream_never_yields_a_split_secret(split_run: tuple[Executor, str]) -> None:
    executor, code = split_run

    async def collect() -> tuple[str, str]:
        text = []
        stdout = ""
        async for event in executor.astream(
            code, secrets=REGISTERED, limits={"output_bytes": OUTPUT_BYTES, "timeout_s": 60}
        ):
            if event.kind == "stdout":
                text.append(event.text or "")
            elif event.kind == "result":
                assert event.result is not None and event.result.status is Status.ok
                stdout = event.result.stdout
        return "".join(text), stdout

    live, stdout = asyncio.run(collect())
    assert not leaked(live)
    assert live == stdout


def test_cli_live_output_never_shows_a_split_secret(
    split_run: tuple[Executor, str], tmp_path: Path
) -> None:
    _, code = split_run
    prog = tmp_path / "split.py"
    prog.write_text(code)
    args = [
        sys.executable,
        "-m",
        "execbox.cli",
        "run",
        str(prog),
        "--timeout",
        "60",
        "--output-bytes",
        str(OUTPUT_BYTES),
    ]
    for value in REGISTERED:
        args += ["--secret", value]
    proc = subprocess.run(args, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    live = proc.stdout.decode()
    assert not leaked(live) and not leaked(proc.stderr.decode())
    assert live.count("[REDACTED:") >= sum(len(s.encode()) - 1 for s in SAMPLES)


def test_held_output_is_released_redacted_when_the_run_times_out(executor: Executor) -> None:
    secret = REGISTERED[0]
    code = (
        "import sys, time\n"
        f"sys.stdout.write('done\\nheld ' + {secret[:4]!r}); sys.stdout.flush()\n"
        "time.sleep(0.2)\n"
        f"sys.stdout.write({secret[4:]!r} + ' tail'); sys.stdout.flush()\n"
        "time.sleep(60)\n"
    )
    out: list[bytes] = []
    result = executor.run(code, secrets=[secret], on_stdout=out.append, limits={"timeout_s": 1})
    assert result.status is Status.timeout
    live = b"".join(out).decode()
    assert live == result.stdout == "done\nheld [REDACTED:secret] tail"


def test_a_cache_hit_streams_its_callers_redacted_output(executor: Executor) -> None:
    secret = "cache-" + REGISTERED[0]
    code = f"print({secret!r})"
    first = executor.run(code, cache=True)
    assert secret in first.stdout  # not registered by its first caller
    fresh = executor.run(code, cache=True, secrets=[secret])
    assert not fresh.cached  # the secrets are part of the key: the clear result never answers
    out: list[bytes] = []
    again = executor.run(code, cache=True, secrets=[secret], on_stdout=out.append)
    assert again.cached and secret not in again.stdout
    assert b"".join(out).decode() == again.stdout == "[REDACTED:secret]\n"
    executor.store.settle()
    record = executor.store.get(again.run_id)
    assert record is not None and secret not in record.model_dump_json()


def test_a_secret_cut_by_the_output_cap_shows_at_most_two_of_its_characters(
    executor: Executor,
) -> None:
    """The cap cuts the output inside a registered secret: what is left of it no longer
    matches it whole, and a review attack read its first 16 characters in the result and the
    live output. The end of a stream that starts a secret is redacted too."""
    secret = "Zz9-PER-RUN-SECRET-" + uuid.uuid4().hex[:8]
    for kept in (3, 5, 16, len(secret) - 1):  # characters of the secret inside the cap
        live: list[bytes] = []
        code = f"import sys\nsys.stdout.write('A' * {1024 - kept})\nsys.stdout.write({secret!r})\n"
        result = executor.run(
            code,
            limits={"output_bytes": 1024},
            secrets=[secret],
            on_stdout=live.append,
            cache=False,
        )
        assert result.status is Status.output_limit and result.stdout_truncated, result
        shown = b"".join(live).decode()
        assert shown == result.stdout, (shown[-40:], result.stdout[-40:])
        assert result.stdout.endswith("A[REDACTED:secret]"), (kept, result.stdout[-40:])
    # Below MIN_CUT_PREFIX characters, a cut is left alone (text may end like a secret starts).
    assert Redactor([secret]).redact_end("AAA" + secret[:2]) == "AAA" + secret[:2]
    assert Redactor([secret]).redact_end("AAA" + secret[:3]) == "AAA[REDACTED:secret]"


def test_escaped_forms_split_across_writes_are_caught() -> None:
    """repr() and json.dumps() of a value with a backslash, quotes, a space and non-ASCII
    letters, cut at every byte across two writes: the live text never shows the escaped form
    and equals the redaction of the whole."""
    import json

    value = "p\\w \"q\" 'r' é-" + uuid.uuid4().hex[:8]
    redactor = Redactor([value])
    for shown in (
        repr(value),
        ascii(value),
        json.dumps(value),
        json.dumps([value]),
        repr({"k": value}),
    ):
        data = ("x = " + shown + " ok\n").encode()
        want = redactor.redact(data.decode())
        assert "[REDACTED:secret]" in want and value[-8:] not in want
        for k in range(1, len(data)):
            assert _live([data[:k], data[k:]], redactor) == want, (shown, k)


def _unclosed_pem_cpu(lines: int) -> float:
    """CPU seconds to stream an unclosed PEM block of `lines` short base64 lines, one per write
    (what a program trickling key-like lines does), through a LiveRedactor."""
    live = LiveRedactor(Redactor(REGISTERED[:2]), lambda _: None)
    start = time.process_time()
    live.write(b"-----BEGIN RSA PRIVATE KEY-----\n")
    for _ in range(lines):
        live.write(b"QUJD\n")
    live.close()
    return time.process_time() - start


def test_a_held_pem_block_costs_linear_time_in_its_lines() -> None:
    # Each write used to rescan every held line: 4x the lines cost 16x the CPU.
    small = min(_unclosed_pem_cpu(5_000) for _ in range(3))
    large = min(_unclosed_pem_cpu(20_000) for _ in range(3))
    assert large < 8 * small + 0.05, (small, large)


def test_an_unclosed_pem_block_past_the_cap_is_redacted_whole_and_not_held() -> None:
    out: list[bytes] = []
    live = LiveRedactor(Redactor(REGISTERED[:2]), out.append)
    live.write(b"key: -----BEGIN RSA PRIVATE KEY-----\n")
    body = b"QUJD\n" * (PEM_HOLD_CHARS // 5 + 2)
    live.write(body)
    assert b"".join(out) == b"key: [REDACTED:private_key]"  # released, not held any more
    live.write(body + b"QUJD\n-----END RSA PRIVATE KEY-----\nafter\nQU")
    assert b"".join(out) == b"key: [REDACTED:private_key]\nafter\n"
    live.close()
    assert b"".join(out) == b"key: [REDACTED:private_key]\nafter\nQU"


def test_the_line_after_a_capped_pem_block_is_shown_and_the_body_is_not() -> None:
    out: list[bytes] = []
    live = LiveRedactor(Redactor(REGISTERED[:2]), out.append)
    live.write(b"-----BEGIN EC PRIVATE KEY-----\n" + b"QUJD\n" * (PEM_HOLD_CHARS // 5 + 2))
    live.write(b"QUJD\nQUJDQUJD")  # a partial body line at the end of the run is not shown
    live.close()
    assert b"".join(out) == b"[REDACTED:private_key]"
    out.clear()
    live = LiveRedactor(Redactor(REGISTERED[:2]), out.append)
    live.write(b"-----BEGIN EC PRIVATE KEY-----\n" + b"QUJD\n" * (PEM_HOLD_CHARS // 5 + 2))
    live.write(b"done, 1 key\n")
    live.close()
    assert b"".join(out) == b"[REDACTED:private_key]done, 1 key\n"


def test_a_masked_display_across_line_breaks_is_held_until_it_can_be_judged() -> None:
    """A start and an end of a value on separate lines are a pair (`redact.MIN_PAIR`): the
    start's line is held until the lines after it show whether an end follows (at most
    MAX_GAP_BREAKS line breaks of marks), so the live text is the whole text's redaction."""
    value = "Tr0ub4dor&3x-" + "k" * 39
    redactor = Redactor([value])
    text = (
        f"start {value[:15]}\n...\n{value[-15:]} end\n"
        f"{value[:6]}\n\nother\n{value[-6:]}\n{value[:10]}\n"
    )
    whole = redactor.redact(text)
    assert whole.count("[REDACTED:secret]") == 2 and value[:15] not in whole
    for size in (1, 3, 7, len(text)):
        out: list[bytes] = []
        live = LiveRedactor(redactor, out.append)
        shown = ""
        for k in range(0, len(text), size):
            live.write(text[k : k + size].encode())
            shown = b"".join(out).decode()
            assert value[:15] not in shown
            assert whole.startswith(shown)
        live.close()
        assert b"".join(out).decode() == whole
    # The start's line is released once a line that ends no gap follows.
    out = []
    live = LiveRedactor(redactor, out.append)
    live.write(f"{value[:6]}\n\n".encode())
    assert out == []
    live.write(b"other\n")
    assert b"".join(out) == f"{value[:6]}\n\nother\n".encode()


def test_a_masked_display_is_redacted_in_the_result_and_live(executor: Executor) -> None:
    """The attack's display through the real sandbox: `key[:6] + '...' + key[-6:]` of a
    12-character value, and the 15-character start and end of a long one on two lines,
    written a few characters at a time."""
    short, long = "Tr0ub4dor&3x", "hunter2-Zq9xK7Lw-abcdefghijklmnopqrstuvwxyz0123456789"
    code = (
        "import sys, time\n"
        f"s, v = {short!r}, {long!r}\n"
        "for shown in ('using key ' + s[:6] + '...' + s[-6:] + '\\n',\n"
        "              v[:15] + '\\n' + v[-15:] + '\\n'):\n"
        "    for k in range(0, len(shown), 4):\n"
        "        sys.stdout.write(shown[k:k + 4]); sys.stdout.flush(); time.sleep(0.002)\n"
    )
    out: list[bytes] = []
    result = executor.run(code, secrets=[short, long], on_stdout=out.append)
    assert result.status is Status.ok, result.error
    assert result.stdout == (
        "using key [REDACTED:secret]...[REDACTED:secret]\n[REDACTED:secret]\n[REDACTED:secret]\n"
    )
    assert b"".join(out).decode() == result.stdout


def test_start_pieces_on_every_line_are_not_all_held() -> None:
    """Hostile output: a value's start on every line. Each line is released once the text
    after it shows no end piece follows, so the stream stays live and linear."""
    redactor = Redactor(["Tr0ub4dor&3x"])

    def run(lines: int) -> float:
        out: list[bytes] = []
        live = LiveRedactor(redactor, out.append)
        start = time.process_time()
        for _ in range(lines):
            live.write(b"Tr0ub4\n")
        held = lines * 7 - len(b"".join(out))
        live.close()
        assert held < 64 and b"".join(out) == b"Tr0ub4\n" * lines
        return time.process_time() - start

    small = min(run(2_000) for _ in range(3))
    large = min(run(8_000) for _ in range(3))
    assert large < 8 * small + 0.05, (small, large)
