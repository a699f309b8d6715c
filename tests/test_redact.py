"""Secret redaction: known formats and registered values vanish, ordinary output stays untouched.

Every fake credential is generated at run time, in the right shape, from pieces concatenated here,
so this file does not itself look like a leaked key to secret scanners.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import string
import sysconfig
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from execbox.redact import (
    DEFAULT,
    MAX_GAP,
    MAX_PART,
    MIN_PART,
    MIN_SECRET_LEN,
    Finding,
    Redactor,
    pair_need,
    part_length,
    refill,
)

UPPER_ALNUM = string.ascii_uppercase + string.digits
ALNUM = string.ascii_letters + string.digits
URLSAFE = ALNUM + "-_"
B64 = ALNUM + "+/"

rng = random.Random(20240611)


def rand(alphabet: str, n: int, *, digit: bool = True) -> str:
    """`n` random characters; with at least one digit (real keys have them) when `digit`."""
    s = "".join(rng.choice(alphabet) for _ in range(n))
    if digit and not any(c.isdigit() for c in s):
        s = s[:-1] + "7"
    return s


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def fake_jwt() -> str:
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    payload = b64url(json.dumps({"sub": "1234567890", "name": "Jo", "iat": 1516239022}).encode())
    return header + "." + payload + "." + b64url(rng.randbytes(32))


def fake_pem(label: str = "RSA PRIVATE") -> str:
    body = base64.b64encode(rng.randbytes(600)).decode()
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    return "\n".join(
        ["-----BEGIN " + label + " KEY-----", *lines, "-----END " + label + " KEY-----"]
    )


@dataclass(frozen=True)
class Case:
    """`text` as a program would print it; `secret` is the part that must go, as `kind`."""

    kind: str
    text: str
    secret: str

    @property
    def expected(self) -> str:
        return self.text.replace(self.secret, f"[REDACTED:{self.kind}]")


def _cases() -> list[Case]:
    aws_id = "AK" + "IA" + rand(UPPER_ALNUM, 16)
    sts_id = "AS" + "IA" + rand(UPPER_ALNUM, 16)
    aws_secret = rand(B64, 40)
    openai_proj = "sk-" + "proj-" + rand(URLSAFE, 156)
    openai_legacy = "sk-" + rand(ALNUM, 20) + "T3Blbk" + "FJ" + rand(ALNUM, 20)
    anthropic = "sk-" + "ant-" + "api03-" + rand(URLSAFE, 93) + "AA"
    gh = ["gh" + c + "_" + rand(ALNUM, 36) for c in "pousr"]
    gh_pat = "github" + "_pat_" + rand(ALNUM, 22) + "_" + rand(ALNUM, 59)
    slack_bot = (
        "xo"
        + "xb-"
        + rand(string.digits, 12)
        + "-"
        + rand(string.digits, 13)
        + "-"
        + rand(ALNUM, 24)
    )
    slack_user = (
        "xo"
        + "xp-"
        + rand(string.digits, 12)
        + "-"
        + rand(string.digits, 12)
        + "-"
        + rand(string.hexdigits.lower(), 32)
    )
    webhook_path = "T" + rand(UPPER_ALNUM, 8) + "/B" + rand(UPPER_ALNUM, 10) + "/" + rand(ALNUM, 24)
    google = "AI" + "za" + rand(URLSAFE, 35)
    stripe_live = "sk" + "_live_" + rand(ALNUM, 24)
    stripe_restricted = "rk" + "_live_" + rand(ALNUM, 24)
    bearer = rand(ALNUM, 20) + "." + rand(ALNUM, 12)
    url_pw = rand(ALNUM, 14)
    query_tok = rand(ALNUM, 32)
    jwt = fake_jwt()
    pem = fake_pem()
    return [
        Case("aws_access_key", aws_id, aws_id),
        Case("aws_access_key", sts_id, sts_id),
        Case("aws_secret_key", "aws_secret_access_key = " + aws_secret, aws_secret),
        Case("openai_key", openai_proj, openai_proj),
        Case("openai_key", openai_legacy, openai_legacy),
        Case("anthropic_key", anthropic, anthropic),
        *(Case("github_token", t, t) for t in gh),
        Case("github_token", gh_pat, gh_pat),
        Case("slack_token", slack_bot, slack_bot),
        Case("slack_token", slack_user, slack_user),
        Case(
            "slack_webhook", "https://hooks.slack" + ".com/services/" + webhook_path, webhook_path
        ),
        Case("jwt", jwt, jwt),
        Case("private_key", pem, pem),
        Case("google_api_key", google, google),
        Case("stripe_key", stripe_live, stripe_live),
        Case("stripe_key", stripe_restricted, stripe_restricted),
        Case("authorization", "Authorization: Bearer " + bearer, bearer),
        Case("url_password", "https://admin:" + url_pw + "@db.example.com:5432/app", url_pw),
        Case(
            "url_param",
            "https://api.example.com/v1/items?token=" + query_tok + "&page=2",
            query_tok,
        ),
    ]


CASES = _cases()
CASE_IDS = [f"{c.kind}-{i}" for i, c in enumerate(CASES)]


def _traceback(s: str) -> str:
    return (
        "Traceback (most recent call last):\n"
        '  File "main.py", line 7, in <module>\n'
        f"    client = connect(credential={s!r})\n"
        '  File "/usr/lib/python3.11/site-packages/client.py", line 42, in connect\n'
        "    raise ValueError(f'rejected credential {credential!r}')\n"
        f"ValueError: rejected credential {s!r}\n"
    )


# Each context wraps the printed text; the same wrapping applied to the expected text must be
# exactly the redactor's output, which checks that everything around the secret stays intact.
CONTEXTS: dict[str, Callable[[str], str]] = {
    "plain": lambda s: f"connecting with {s} now",
    "alone": lambda s: s,
    "line_start": lambda s: f"{s}\nnext line",
    "line_end": lambda s: f"first line\nkey {s}",
    "crlf": lambda s: f"a\r\n{s}\r\nb",
    "json": lambda s: json.dumps({"id": 7, "credential": s, "ok": True}),
    "json_compact": lambda s: json.dumps({"credential": s}, separators=(",", ":")),
    "python_repr": lambda s: repr({"credential": s, "n": 1}),
    "traceback": _traceback,
    "url_path": lambda s: f"GET https://example.com/files/{s}/download 200",
    "parens": lambda s: f"value ({s}) used",
    "brackets": lambda s: f"[{s}]",
    "angle": lambda s: f"<{s}>",
    "comma": lambda s: f"a,{s},b",
    "semicolon": lambda s: f"{s};",
    "full_stop": lambda s: f"The key is {s}.",
    "tab": lambda s: f"key\t{s}\tend",
}


SLASH_KINDS = {"slack_webhook", "authorization"}


@pytest.mark.parametrize("context", list(CONTEXTS))
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_known_secret_is_redacted_and_surrounding_text_kept(case: Case, context: str) -> None:
    wrap = CONTEXTS[context]
    out = DEFAULT.redact(wrap(case.text))
    assert case.secret not in out
    if context == "url_path" and case.kind in SLASH_KINDS:
        # These formats may themselves contain '/', so the path after them is taken too.
        head, _, _ = wrap(case.expected).partition(f"[REDACTED:{case.kind}]")
        assert out == f"{head}[REDACTED:{case.kind}] 200"
    else:
        assert out == wrap(case.expected)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_findings_give_kind_and_exact_span(case: Case) -> None:
    text = "prefix " + case.text + " suffix"
    (finding,) = DEFAULT.findings(text)
    assert finding.kind == case.kind
    assert text[finding.start : finding.end] == case.secret


def test_rules_skip_only_texts_too_short_to_match() -> None:
    """A text shorter than a rule's `min_len` is not scanned by it: every rule has a bound
    (short outputs skip the scans), and no match of any rule on any case is shorter."""
    from execbox.redact.rules import RULES

    assert all(rule.min_len > 0 for rule in RULES), [r.kind for r in RULES if not r.min_len]
    for case in CASES:
        for rule in RULES:
            subject = case.text.lower() if rule.lowered else case.text
            for m in rule.pattern.finditer(subject):
                assert m.end() - m.start() >= rule.min_len, (rule.kind, case.text)
        # The secret alone, with nothing around it to lengthen the text, is still found.
        assert DEFAULT.redact(case.text) == case.expected


@pytest.mark.parametrize("context", list(CONTEXTS))
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_redaction_is_idempotent(case: Case, context: str) -> None:
    once = DEFAULT.redact(CONTEXTS[context](case.text))
    assert DEFAULT.redact(once) == once
    assert DEFAULT.findings(once) == []


def test_all_secrets_in_one_text_are_redacted() -> None:
    text = "\n".join(f"{i}: {c.text}" for i, c in enumerate(CASES))
    out = DEFAULT.redact(text)
    assert out == "\n".join(f"{i}: {c.expected}" for i, c in enumerate(CASES))
    assert len(DEFAULT.findings(text)) == len(CASES)


# ---- specific shapes ---------------------------------------------------------------------------


def test_spec_examples_keep_their_context() -> None:
    assert DEFAULT.redact("Authorization: Bearer abc.def") == (
        "Authorization: Bearer [REDACTED:authorization]"
    )
    assert DEFAULT.redact("https://user:pw@host/x") == "https://user:[REDACTED:url_password]@host/x"
    assert DEFAULT.redact("GET /x?token=XYZ&a=1") == "GET /x?token=[REDACTED:url_param]&a=1"


def test_pem_block_is_replaced_from_begin_to_end_line() -> None:
    for label in ("RSA PRIVATE", "EC PRIVATE", "OPENSSH PRIVATE", "PRIVATE", "ENCRYPTED PRIVATE"):
        pem = fake_pem(label)
        assert DEFAULT.redact(f"key:\n{pem}\ndone") == "key:\n[REDACTED:private_key]\ndone"
    pgp = fake_pem("PGP PRIVATE").replace(" KEY-----", " KEY BLOCK-----")
    assert DEFAULT.redact(pgp) == "[REDACTED:private_key]"


def test_pem_block_cut_off_before_its_end_line_is_still_redacted() -> None:
    pem = fake_pem()
    cut = pem[: pem.index("-----END")]
    body = cut.splitlines()[1:-1]  # every full 64-character line
    out = DEFAULT.redact("before\n" + cut)
    assert out.startswith("before\n[REDACTED:private_key]")
    assert not any(line in out for line in body)


def test_public_keys_and_certificates_are_not_secrets() -> None:
    cert = fake_pem("PUBLIC").replace("PUBLIC KEY", "CERTIFICATE")
    for text in (fake_pem("PUBLIC"), fake_pem("RSA PUBLIC"), cert):
        assert DEFAULT.redact(text) == text


def test_jwt_in_authorization_header_is_named_jwt() -> None:
    jwt = fake_jwt()
    assert DEFAULT.redact("Authorization: Bearer " + jwt) == "Authorization: Bearer [REDACTED:jwt]"


def test_bearer_token_outside_a_header() -> None:
    tok = rand(ALNUM, 40)
    assert DEFAULT.redact(f"curl -H 'x: Bearer {tok}' https://a") == (
        "curl -H 'x: Bearer [REDACTED:bearer_token]' https://a"
    )


def test_other_authorization_schemes_and_api_key_headers() -> None:
    basic = base64.b64encode(b"user:pass" + rand(ALNUM, 8).encode()).decode()
    tok = rand(ALNUM, 32)
    assert DEFAULT.redact("Authorization: Basic " + basic) == (
        "Authorization: Basic [REDACTED:authorization]"
    )
    assert DEFAULT.redact("authorization: token " + tok) == (
        "authorization: token [REDACTED:authorization]"
    )
    assert DEFAULT.redact("X-API-Key: " + tok) == "X-API-Key: [REDACTED:credential]"
    assert DEFAULT.redact(json.dumps({"api_key": tok})) == '{"api_key": "[REDACTED:credential]"}'


def test_aws_secret_key_needs_context() -> None:
    secret = rand(B64, 40)
    assert DEFAULT.redact(secret) == secret  # 40 random characters alone are not a key
    for text in (
        f'"SecretAccessKey": "{secret}"',
        f"AWS_SECRET_ACCESS_KEY={secret}",
        f"--aws-secret-access-key {secret}",
        f"aws_secret_key: '{secret}'",
    ):
        out = DEFAULT.redact(text)
        assert secret not in out and "[REDACTED:aws_secret_key]" in out, text


@pytest.mark.parametrize(
    "name",
    [
        "token",
        "access_token",
        "api_key",
        "apikey",
        "refresh_token",
        "client_secret",
        "X-Amz-Security-Token",
        "sig",
        "password",
    ],
)
def test_secret_query_parameters(name: str) -> None:
    value = rand(ALNUM, 24)
    for sep in ("?", "&", "#", "&amp;"):
        text = f"https://svc.example.com/cb?x=1{sep}{name}={value}&y=2"
        assert DEFAULT.redact(text) == text.replace(value, "[REDACTED:url_param]")


def test_url_password_with_unencoded_at_sign() -> None:
    pw = rand(ALNUM, 6) + "@" + rand(ALNUM, 6)
    text = f"postgresql://app:{pw}@db.internal:5432/main"
    assert DEFAULT.redact(text) == "postgresql://app:[REDACTED:url_password]@db.internal:5432/main"


def test_key_after_escaped_newline_in_json_string() -> None:
    key = "AK" + "IA" + rand(UPPER_ALNUM, 16)
    text = json.dumps({"log": "line one\n" + key + "\tdone"})
    assert key not in DEFAULT.redact(text)


def test_printed_placeholder_does_not_shield_a_secret() -> None:
    key = "AK" + "IA" + rand(UPPER_ALNUM, 16)
    assert key not in DEFAULT.redact("[REDACTED:secret]" + key)
    r = Redactor(["hunter2hunter2"])
    assert "hunter2hunter2" not in r.redact("[REDACTED:hunter2hunter2]")


# ---- registered values -------------------------------------------------------------------------


def test_registered_secret_is_redacted_everywhere_and_every_time() -> None:
    value = "pa55-" + rand(ALNUM, 10)
    r = Redactor([value])
    text = f"{value} then x{value}y and again:{value}\n{value}"
    assert r.redact(text) == (
        "[REDACTED:secret] then x[REDACTED:secret]y and again:[REDACTED:secret]\n[REDACTED:secret]"
    )
    assert [f.kind for f in r.findings(text)] == ["secret"] * 4


def test_registered_secret_inside_longer_words() -> None:
    r = Redactor(["tiger"])
    assert r.redact("bengaltigers") == "bengal[REDACTED:secret]s"


def test_overlapping_occurrences_of_a_registered_secret_are_all_covered() -> None:
    r = Redactor(["abab"])
    assert r.redact("xababababy") == "x[REDACTED:secret]y"


def test_registered_secret_containing_another_is_one_redaction() -> None:
    r = Redactor(["secretvalue", "value"])
    assert r.redact("a secretvalue b value") == "a [REDACTED:secret] b [REDACTED:secret]"


def test_registered_values_shorter_than_minimum_are_skipped() -> None:
    assert MIN_SECRET_LEN == 4
    r = Redactor(["", "a", "ab", "abc", "abcd"])
    assert r.redact("abc abcd") == "abc [REDACTED:secret]"


def test_registered_secrets_are_redacted_idempotently() -> None:
    r = Redactor(["REDACTED", "secret", "sEcr3t-value"])
    once = r.redact("REDACTED secret sEcr3t-value")
    assert r.redact(once) == once


def test_with_secrets_returns_a_new_redactor() -> None:
    base = Redactor(["first-secret"])
    more = base.with_secrets(["second-secret"])
    text = "first-secret second-secret"
    assert more.redact(text) == "[REDACTED:secret] [REDACTED:secret]"
    assert base.redact(text) == "[REDACTED:secret] second-secret"
    assert DEFAULT.redact(text) == text


def test_registered_secret_and_known_format_together() -> None:
    key = "gh" + "p_" + rand(ALNUM, 36)
    pw = "db-pass-" + rand(ALNUM, 6)
    r = Redactor([pw])
    out = r.redact(f"{key} {pw}")
    assert out == "[REDACTED:github_token] [REDACTED:secret]"


# Secrets a plain match misses once a program shows them escaped: a backslash, both quotes,
# non-ASCII letters, a space, a slash, a line break.
ESCAPED_SECRETS = (
    "pa\\ss\"w0rd'" + rand(ALNUM, 6),
    "m\u00fcnchen-gr\u00fc\u00dfe " + rand(ALNUM, 6),
    "a/b c+d&e=" + rand(ALNUM, 6),
    "two\nlines\t" + rand(ALNUM, 6),
)


def _shown(value: str) -> dict[str, str]:
    """`value` as common ways of printing it show it, each beside other text."""
    from urllib.parse import quote, quote_plus, urlencode

    return {
        "repr": repr(value),
        "ascii": ascii(value),
        "repr of a dict": repr({"k": value, 1: 2}),
        "repr of a list with a quote": repr([value, 'it\'s "x"']),
        "repr of bytes": repr(value.encode()),
        "str in a bytes literal": str([value.encode()]),
        "json": json.dumps({"k": value}),
        "json not ascii": json.dumps([value], ensure_ascii=False),
        "quote": "https://h/p/" + quote(value) + "?x=1",
        "quote no safe": quote(value, safe=""),
        "quote_plus": "q=" + quote_plus(value),
        "urlencode": urlencode({"token": value}),
        "html": "<td>" + __import__("html").escape(value) + "</td>",
    }


@pytest.mark.parametrize("value", ESCAPED_SECRETS)
def test_registered_secret_is_redacted_in_its_escaped_forms(value: str) -> None:
    r = Redactor([value])
    for how, text in _shown(value).items():
        out = r.redact(text)
        assert "[REDACTED:secret]" in out, (how, text)
        # Nothing of the value is left: not its escaped text, not a piece of it.
        core = value[2:-2]
        assert core not in out and value[-6:] not in out, (how, out)


def test_an_escaped_form_cut_at_the_end_of_a_stream_is_redacted() -> None:
    value = ESCAPED_SECRETS[0]
    shown = json.dumps(value)
    r = Redactor([value])
    assert r.redact_end("out: " + shown[:12]) == 'out: "[REDACTED:secret]'


def test_html_escaped_without_quotes_as_pandas_does_is_redacted() -> None:
    value = "p&ss\"w'rd<9>" + rand(ALNUM, 6)
    shown = value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    assert Redactor([value]).redact(f"<td>{shown}</td>") == "<td>[REDACTED:secret]</td>"


LONG_VALUE = "ghx_" + rand(ALNUM, 52)


# How displays and programs cut a long value short: an ellipsis (pandas, reprlib), the marks
# of textwrap.shorten and of hand-written truncation, spaced dots, and no mark at all (a slice,
# a fixed-width column, a wrap onto the next line).
CUT_MARKS = ["...", "\u2026", " [...]", "[truncated]", " (more)", ". . .", "", "\n", " "]


@pytest.mark.parametrize("k", [16, 28, 40, 55])
@pytest.mark.parametrize("mark", CUT_MARKS)
def test_a_long_start_or_end_of_a_value_is_redacted_whatever_mark_cuts_it(
    k: int, mark: str
) -> None:
    """An attack read 30-40 of 52 characters of a value shown cut short with ` [...]`,
    `[truncated]`, ` (more)` or `. . .` (only an ellipsis was recognised). A start or an end
    of a value at least `part_length` long is redacted wherever it appears."""
    r = Redactor([LONG_VALUE])
    assert part_length(LONG_VALUE) == MAX_PART == 16
    start, end = LONG_VALUE[:k], LONG_VALUE[-k:]
    assert r.redact(f"0  {start}{mark}\n") == f"0  [REDACTED:secret]{mark}\n"
    assert r.redact(f"{mark}{end}|") == f"{mark}[REDACTED:secret]|"
    # Its repr's start and end too (a cut list or dict repr), and both halves of a wrap.
    assert r.redact(f"['{start}{mark}") == f"['[REDACTED:secret]{mark}"
    half = len(LONG_VALUE) // 2
    wrapped = r.redact(f"{LONG_VALUE[:half]}{mark}{LONG_VALUE[half:]}")
    assert wrapped == (f"[REDACTED:secret]{mark}[REDACTED:secret]" if mark else "[REDACTED:secret]")


def test_a_start_or_end_shorter_than_its_part_stays() -> None:
    r = Redactor([LONG_VALUE])
    for text in (LONG_VALUE[:15] + "...", "see " + LONG_VALUE[-15:], LONG_VALUE[:15] + " [...]"):
        assert r.redact(text) == text
    # A value no longer than MIN_PART has no part but itself.
    assert Redactor(["abcdefgh"]).redact("abcdefg...") == "abcdefg..."
    # A 12-character value: its parts are 8 long (more than half of it).
    assert part_length("abcdefghijkl") == MIN_PART
    assert (
        Redactor(["abcdefghijkl"]).redact("abcdefgh... abcdefg=x efghijkl fghijkl")
        == "[REDACTED:secret]... abcdefg=x [REDACTED:secret] fghijkl"
    )
    # Half of a 20-character value is 10 characters.
    assert (
        Redactor(["abcdefghij0123456789"]).redact("abcdefghi abcdefghij0")
        == "abcdefghi [REDACTED:secret]"
    )


def test_a_part_follows_its_value_only_within_a_line() -> None:
    """Live output is redacted line by line: a part matched in the whole text stops at a
    line break, so both find the same spans."""
    value = "first-line-" + rand(ALNUM, 9) + "\nsecond-line-" + rand(ALNUM, 9)
    first, last = value.split("\n")
    r = Redactor([value])
    assert r.redact(first + "\nsecond") == "[REDACTED:secret]\nsecond"
    # (Not followed by a mark: a start and an end across a break are a pair, see MIN_PAIR.)
    assert r.redact("first-=\n" + last) == "first-=\n[REDACTED:secret]"


def test_parts_of_random_values_leave_ordinary_text_alone() -> None:
    """The measured false-positive rate: 64 random tokens of 12 to 60 characters find no
    part of themselves in 2 MiB of the standard library's source and docstrings."""
    rng = random.Random(5)
    values = ["".join(rng.choice(ALNUM) for _ in range(rng.randint(12, 60))) for _ in range(64)]
    text = _stdlib_text(2 << 20)
    assert Redactor(values, patterns=False).findings(text) == []


def _stdlib_text(size: int) -> str:
    parts, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        parts.append(path.read_text(encoding="utf-8", errors="replace"))
        total += len(parts[-1])
        if total >= size:
            break
    return "".join(parts)[:size]


@pytest.mark.serial
def test_parts_cost_linear_time_in_hostile_text() -> None:
    """Output made of a value's parts end to end, each one a match widened along the value."""
    r = Redactor(["a" * 40, LONG_VALUE])
    for piece in (LONG_VALUE[:20] + "|", LONG_VALUE[-20:], LONG_VALUE[:30] + LONG_VALUE[-30:]):
        small, large = piece * 2_000, piece * 8_000
        assert LONG_VALUE[:16] not in r.redact(small) and LONG_VALUE[-16:] not in r.redact(small)
        t_small = min(_time(r.redact, small) for _ in range(3))
        t_large = min(_time(r.redact, large) for _ in range(3))
        assert t_large < 8 * t_small + 0.05, (piece, t_small, t_large)


def test_cut_starts_before_ellipses_cost_linear_time() -> None:
    r = Redactor(["a" * 40, LONG_VALUE])
    small, large = ("a" * 30 + "...") * 4_000, ("a" * 30 + "...") * 16_000
    # Each run is a start of "a" * 40 at each of its characters; past the scan budget, spans
    # are widened instead (more is redacted, never less).
    assert r.redact(small[:3_300]) == "[REDACTED:secret]..." * 100
    assert "a" * 16 not in r.redact(small)
    t_small = min(_time(r.redact, small) for _ in range(3))
    t_large = min(_time(r.redact, large) for _ in range(3))
    assert t_large < 8 * t_small + 0.05, (t_small, t_large)


def _time(fn: Callable[[str], object], arg: str) -> float:
    start = time.perf_counter()
    fn(arg)
    return time.perf_counter() - start


def test_occurrences_chained_across_values_are_all_covered() -> None:
    # Leftmost-longest matching reports "xxab" and then looks after it; "abcdef" starts inside
    # it and "efyy" inside that: all three are covered.
    r = Redactor(["xxab", "abcdef", "efyy"])
    assert r.redact("1xxabcdefyy2") == "1[REDACTED:secret]2"
    assert r.redact("abcdefyy xxab") == "[REDACTED:secret] [REDACTED:secret]"


def _scan_s(redactor: Redactor, text: str, rounds: int = 5) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        redactor.findings(text)
        best = min(best, time.perf_counter() - t)
    return best


def test_many_registered_values_are_matched_in_one_pass() -> None:
    """A scan costs about the same with the most values a request may register as with four
    (one scan per value would make it ~60 times more)."""
    values = [f"tok-{i:04d}-" + rand(ALNUM, 40) for i in range(256)]  # MAX_SECRETS
    text = "ordinary output 12345 of a program, with words and numbers\n" * 16_000  # ~1 MiB
    few = Redactor(values[:4], patterns=False)
    many = Redactor(values, patterns=False)
    assert many.redact(text + values[-1]).endswith("[REDACTED:secret]")
    assert _scan_s(many, text) < 8 * _scan_s(few, text) + 0.002


def test_a_value_overlapping_itself_everywhere_stays_linear() -> None:
    """A hostile text for a value that overlaps itself ("aaaa" in a run of a's, with a long
    value registered beside it) is scanned in time linear in its size, and fully covered."""
    r = Redactor(["aaaa", "b" * 4000 + "aaa"], patterns=False)

    def text(n: int) -> str:
        return "aaaaab" * n

    small, large = _scan_s(r, text(20_000), 3), _scan_s(r, text(80_000), 3)
    assert large < 8 * small + 0.01
    assert set(r.redact(text(1000)).replace("[REDACTED:secret]", "")) <= {"b"}


def test_finding_is_a_plain_dataclass() -> None:
    assert Redactor(["wxyz"]).findings("_wxyz_") == [Finding("secret", 1, 5)]


# ---- ordinary output stays untouched -------------------------------------------------------------

DATAFRAME = """\
      region  units    price       date
0      north     12   3.5000 2024-01-03
1      south      7  12.2500 2024-01-04
2       east    140   0.9900 2024-01-05
3       west     33  18.0000 2024-01-06
...      ...    ...      ...        ...
9995   north      5   4.1200 2026-09-21
[9996 rows x 4 columns]
region
east     14012
north    12800
south     9981
west     11205
Name: units, dtype: int64
              units         price
count  9996.000000  9.996000e+03
mean     48.013505  1.093142e+01
std      28.866070  5.777530e+00
min       1.000000  1.000000e-02
25%      24.000000  5.930000e+00
50%      48.000000  1.094500e+01
75%      72.000000  1.589250e+01
max     100.000000  2.000000e+01
<class 'pandas.core.frame.DataFrame'>
RangeIndex: 9996 entries, 0 to 9995
Data columns (total 4 columns):
 #   Column  Non-Null Count  Dtype
---  ------  --------------  -----
 0   region  9996 non-null   object
 1   units   9996 non-null   int64
dtypes: float64(1), int64(1), object(2)
memory usage: 312.5+ KB
"""

NUMPY = """\
array([[ 0.49671415, -0.1382643 ,  0.64768854,  1.52302986],
       [-0.23415337, -0.23413696,  1.57921282,  0.76743473]])
[1.00000000e+00 2.71828183e+00 7.38905610e+00 2.00855369e+01]
array([ True, False,  True]) dtype('float64') (3, 4) int64
tensor([[0.1000, 0.2000]], dtype=torch.float32)
"""

TRACEBACK = """\
Traceback (most recent call last):
  File "main.py", line 12, in <module>
    total = df.groupby("region")["unitz"].sum()
            ~~~~~~~~~~~~~~~~~~~~^^^^^^^^^
  File "/usr/lib/python3/dist-packages/pandas/core/groupby/generic.py", line 1771, in __getitem__
    return super().__getitem__(key)
KeyError: 'Column not found: unitz'
During handling of the above exception, another exception occurred:
  File "/workspace/main.py", line 14, in <module>
    token_count = count_tokens(text, max_tokens=4096)
TypeError: count_tokens() got an unexpected keyword argument 'max_tokens'
"""

ENGLISH = """\
The bearer of this letter is a trusted friend. Authorization is required before the secret
garden may be visited; the API key to the shed is kept under the mat. A token of thanks was
given, and the password to the club is, of course, not written down anywhere. Keys, tokens and
secrets are discussed at length in chapter 4: see section 4.2 (pages 112-118) for details.
Risk-management frameworks, task-oriented dialogue, desk-research and ask-me-anything sessions.
"""

CSV = """\
order_id,customer,region,units,price,ordered_at,sku
100231,ACME Corp,north,12,3.50,2024-01-03T09:15:00Z,SKU-AKX-00912
100232,Globex,south,7,12.25,2024-01-04T11:02:31Z,SKU-BQZ-11873
100233,"Initech, Inc.",east,140,0.99,2024-01-05T16:45:09+01:00,SKU-CWE-55521
"""

MISC = """\
Collecting numpy==1.26.4 (from -r requirements.txt (line 1))
  Downloading numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.whl (18.3 MB)
Successfully installed numpy-1.26.4 pandas-2.2.1
GET https://api.example.com/v2/items?page=2&sort=asc&limit=50 -> 200 OK (31 ms)
see https://docs.python.org/3/library/re.html#re.compile and http://localhost:8080/health
git clone git@github.com:example/repo.git; ssh://git@example.com/repo.git
docker pull python@sha256:9b0d0e8b3c4a7c0f1e2d3c4b5a69788766554433221100ffeeddccbbaa998877
Saved figure to /workspace/out/chart_2024-01-05.png (1200x800, 45.2 KiB)
C:\\Users\\analyst\\AppData\\Local\\Temp\\tmp8f3k2_1x\\data.parquet
api_key=None access_token: str | None = None, secret_key: bytes, password=os.environ["X"]
Epoch 3/10 - loss: 0.2314 - acc: 0.9123 - val_loss: 0.2710 - lr: 1.0e-04
"""


def _numbers() -> str:
    r = random.Random(1)
    ints = [str(r.randint(-(10**12), 10**12)) for _ in range(200)]
    floats = [repr(r.uniform(-1e6, 1e6)) for _ in range(200)] + [
        f"{r.random():.3e}" for _ in range(100)
    ]
    return " ".join(ints + floats)


def _digests() -> list[str]:
    r = random.Random(2)
    out = []
    for _ in range(300):
        data = r.randbytes(64)
        out += [
            hashlib.sha256(data).hexdigest(),
            hashlib.sha1(data).hexdigest(),
            hashlib.md5(data).hexdigest(),
            hashlib.sha512(data).hexdigest(),
            hashlib.sha256(data).hexdigest().upper(),
            "sha256:" + hashlib.sha256(data).hexdigest(),
            f"{hashlib.sha256(data).hexdigest()}  data/file_{r.randint(0, 999)}.csv",
        ]
    return out


def _git_log() -> str:
    r = random.Random(3)
    lines = []
    for i in range(100):
        h = hashlib.sha1(r.randbytes(20)).hexdigest()
        lines.append(f"commit {h}\n{h[:7]} Fix issue #{i}: handle empty frames (HEAD -> main)")
    return "\n".join(lines)


def _uuids() -> str:
    r = random.Random(4)
    return "\n".join(str(uuid.UUID(int=r.getrandbits(128), version=4)) for _ in range(300))


def _paths_and_times() -> str:
    r = random.Random(5)
    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    lines = []
    for _ in range(200):
        t = t0 + timedelta(seconds=r.randint(0, 10**8), microseconds=r.randint(0, 10**6 - 1))
        lines.append(
            f"{t.isoformat()} {t.strftime('%Y-%m-%dT%H:%M:%SZ')} {t.timestamp()} "
            f"/var/lib/execbox/runs/{r.getrandbits(64):016x}/workspace/out_{r.randint(0, 99)}.json"
        )
    return "\n".join(lines)


ORDINARY: dict[str, str] = {
    "numbers": _numbers(),
    "dataframe": DATAFRAME,
    "numpy": NUMPY,
    "traceback": TRACEBACK,
    "english": ENGLISH,
    "csv": CSV,
    "misc": MISC,
    "digests": "\n".join(_digests()),
    "git_log": _git_log(),
    "uuids": _uuids(),
    "paths_and_timestamps": _paths_and_times(),
}


@pytest.mark.parametrize("name", list(ORDINARY))
def test_ordinary_output_is_not_altered(name: str) -> None:
    text = ORDINARY[name]
    assert DEFAULT.findings(text) == []
    assert DEFAULT.redact(text) == text


def _false_positive_rate(samples: list[str]) -> float:
    return sum(DEFAULT.redact(s) != s for s in samples) / len(samples)


def test_base64_of_random_bytes_is_rarely_altered(
    record_property: Callable[[str, object], None],
) -> None:
    """The spec's corpus: 200 samples of 24-96 random bytes, standard base64; at most 1 %."""
    r = random.Random(6)
    samples = [base64.b64encode(r.randbytes(r.randint(24, 96))).decode() for _ in range(200)]
    rate = _false_positive_rate(samples)
    record_property("base64_false_positive_rate", rate)
    print(f"base64 false-positive rate: {rate:.2%} of {len(samples)}")
    assert rate <= 0.01


@pytest.mark.parametrize("encoding", ["base64", "base64url", "hex", "base64_in_json"])
def test_random_data_false_positive_rate_is_low(
    encoding: str, record_property: Callable[[str, object], None]
) -> None:
    """A larger measurement (5000 samples each) so a rate well under 1 % is visible."""
    r = random.Random(7)
    encode: Callable[[bytes], str] = {
        "base64": lambda b: base64.b64encode(b).decode(),
        "base64url": lambda b: base64.urlsafe_b64encode(b).decode(),
        "hex": bytes.hex,
        "base64_in_json": lambda b: json.dumps({"data": base64.b64encode(b).decode()}),
    }[encoding]
    samples = [encode(r.randbytes(r.randint(24, 96))) for _ in range(5000)]
    rate = _false_positive_rate(samples)
    record_property(f"{encoding}_false_positive_rate", rate)
    print(f"{encoding} false-positive rate: {rate:.3%} of {len(samples)}")
    assert rate <= 0.001


# ---- performance guard (not a benchmark) ----------------------------------------------------------

MIB = 1 << 20


def _best_of(n: int, f: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(n):
        t = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t)
    return best


def assert_linear(text: str) -> None:
    """Redacting 16 times the text takes about 16 times as long, not 256 (a backtracking
    pattern is quadratic or worse). A ratio, so a loaded machine does not fail it; the
    absolute figure (~15-20 ms per MiB) is bench material."""
    small = text[: len(text) // 16]
    t_small = _best_of(3, lambda: DEFAULT.redact(small))
    t_full = _best_of(3, lambda: DEFAULT.redact(text))
    assert t_full < 64 * t_small + 0.05, (
        f"{t_full:.3f} s for 16x the text that took {t_small:.4f} s"
    )


def test_one_mib_of_ordinary_output_is_fast() -> None:
    """Catches pathological (backtracking) patterns; the real figure is ~15-20 ms per MiB."""
    corpus = "\n".join(ORDINARY.values())
    text = (corpus * (MIB // len(corpus) + 1))[:MIB]
    assert DEFAULT.redact(text) == text
    assert_linear(text)


@pytest.mark.serial
def test_one_mib_of_near_misses_is_fast() -> None:
    """Text dense with every rule's prefix and keyword but no complete secret."""
    near = (
        "AKIA sk- sk-ant- ghp_ github_pat_ xoxb- eyJhbGci.x AIza sk_live_ -----BEGIN X "
        "Authorization: Bearer . api_key= secret_access_key= https://u:x ?token= &sig= #a "
        "\\n aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa:@ \n"
    )
    text = (near * (MIB // len(near) + 1))[:MIB]
    DEFAULT.redact(text)
    assert_linear(text)


def test_unterminated_pem_headers_are_fast() -> None:
    text = (("-----BEGIN RSA " + "PRIVATE KEY-----\nabc\n") * (MIB // 40))[:MIB]
    assert_linear(text)


def test_the_end_of_a_secret_at_the_start_of_a_cut_text_is_redacted() -> None:
    value = "hunter2-Zq9xK7Lw"
    r = Redactor([value])
    assert r.redact_start("K7Lw and more") == "[REDACTED:secret] and more"
    assert r.redact_start(value[-3:] + " x") == "[REDACTED:secret] x"  # MIN_CUT_PREFIX
    assert r.redact_start(value[-2:] + " x") == value[-2:] + " x"  # too short to tell
    assert r.redact_start("K7Lw " + value) == "[REDACTED:secret] [REDACTED:secret]"
    assert r.redact_start("no secret here") == "no secret here"


MASKS = ["...", "\u2026", "******", " ", "", "\n", " ...\n", "', '"]


@pytest.mark.parametrize("mask", MASKS)
def test_a_masked_display_of_a_value_is_redacted(mask: str) -> None:
    """An attack showed a 12-character value whole as `key[:6] + '...' + key[-6:]` (each piece
    under the 8-character part), and 28 of 30 characters as `key[:14]...key[-14:]`. A start
    and an end close together that cover half the value are redacted, each however short."""
    for value, k in (
        ("Tr0ub4dor&3x", 6),
        (rand(ALNUM, 30), 14),
        (LONG_VALUE, 8),
        (rand(ALNUM, 12), 3),
    ):
        r = Redactor([value])
        assert pair_need(value) <= 2 * k < part_length(value) * 2
        shown = f"using key {value[:k]}{mask}{value[-k:]}!"
        assert (
            r.redact(shown) == f"using key [REDACTED:secret]{mask}[REDACTED:secret]!"
            if mask
            else "using key [REDACTED:secret]!"
        ), (value, shown)
        assert value[:3] not in r.redact(shown) and value[-3:] not in r.redact(shown)


def test_a_start_and_an_end_on_separate_lines_are_a_pair() -> None:
    """An attack printed a value's 15-character start and end on two lines (each under the
    16-character part): up to MAX_GAP_BREAKS line breaks may separate a pair's pieces."""
    r = Redactor([LONG_VALUE])
    start, end = LONG_VALUE[:15], LONG_VALUE[-15:]
    for gap in ("\n", "\n\n", "...\n  ", "\r\n"):
        assert r.redact(f"a {start}{gap}{end} b") == f"a [REDACTED:secret]{gap}[REDACTED:secret] b"
    # Three line breaks, a gap longer than MAX_GAP, a word between: pieces apart, shown.
    for gap in ("\n\n\n", "." * (MAX_GAP + 1), " and ", "\nx\n"):
        assert r.redact(f"{start}{gap}{end}") == f"{start}{gap}{end}"
    # Pieces covering less than half of the value, or under MIN_PAIR characters, stay.
    for a, b in ((7, 7), (2, 15), (15, 2)):
        text = f"{LONG_VALUE[:a]}...{LONG_VALUE[-b:]}"
        assert r.redact(text) == text
    # An end before a start is no display of the value.
    assert r.redact(f"{end}...{start}") == f"{end}...{start}"


def test_pairs_of_random_values_leave_ordinary_text_alone() -> None:
    """Short values have 3-character pair anchors: 64 random tokens of 8 to 24 characters
    find no pair in 2 MiB of the standard library's source."""
    rng = random.Random(6)
    values = ["".join(rng.choice(ALNUM) for _ in range(rng.randint(8, 24))) for _ in range(64)]
    assert Redactor(values, patterns=False).findings(_stdlib_text(2 << 20)) == []


@pytest.mark.serial
def test_pairs_cost_linear_time_in_hostile_text() -> None:
    """Output made of a short value's start and end pieces at every character."""
    value = "Tr0ub4dor&3x"
    r = Redactor([value, "a" * 40])
    for piece in ("Tr0ub4...dor&3x ", "Tr0" * 5 + "." * 3 + "&3x" * 5, "aaa.a." * 10):
        small, large = piece * 2_000, piece * 8_000
        assert "Tr0ub4" not in r.redact(small)
        t_small = min(_time(r.redact, small) for _ in range(3))
        t_large = min(_time(r.redact, large) for _ in range(3))
        assert t_large < 8 * t_small + 0.05, (piece, t_small, t_large)


@pytest.mark.parametrize("size", [5_000, 60_000])
def test_a_start_or_end_of_a_long_value_is_refilled_exactly(size: int) -> None:
    """An attack sealed code holding the 20-character start of a 5,000-character value:
    given the value again, the record could not be refilled (pieces of forms over 4 KiB were
    not tried). A hole keeps its piece's length, so one piece per form is tried."""
    value = rand(ALNUM, size - 4) + "\\é\"'"
    r = Redactor([value])

    def digest(data: bytes) -> str:
        return hashlib.sha256(b"key" + data).hexdigest()

    code = f"a = {value[:20]!r}\nb = {value[-24:]!r}\nc = {json.dumps(value)[1:30]}\n"
    sealed, holes = r.seal(code, digest)
    assert value[:16] not in sealed and len(holes) == 3, sealed
    assert all(h.length is not None for h in holes)
    start = time.perf_counter()
    assert refill(sealed, holes, [value], digest) == (code, 0)
    assert time.perf_counter() - start < 0.5
    # A whole value's hole keeps no length (it would tell the value's).
    _, whole = r.seal(f"x = {value!r}", digest)
    assert [h.length for h in whole] == [None]


def test_a_value_repeated_keeps_one_placeholder_each() -> None:
    """Pair anchors inside what is redacted already are not followed: a log printing a value
    20,000 times neither spends the pair budget nor, past it, loses the text between them."""
    value = "hunter2-" + rand(ALNUM, 44)
    text = (value + " ok\n") * 20_000
    assert Redactor([value]).redact(text) == "[REDACTED:secret] ok\n" * 20_000


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_screen_finds_every_text_a_rule_matches(case: Case) -> None:
    """Short texts are searched rule by rule only when the one-expression screen matches:
    wherever any rule matches (every case, in every context, and cut short), so does the
    screen, and redaction through it is what the rules alone give."""
    from execbox.redact.rules import RULES, lower_same_length, screen

    for wrap in CONTEXTS.values():
        text = wrap(case.text)
        for cut in range(len(text), 0, -7):
            part = text[:cut]
            lowered = lower_same_length(part)
            hits = [r for r in RULES if r.pattern.search(lowered if r.lowered else part)]
            assert screen(part, lowered) == bool(hits), (part, [r.kind for r in hits])
    assert not screen("print(1)\n", "print(1)\n")  # ordinary code takes the short way
