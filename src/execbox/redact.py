"""Secret redaction: scrub credentials from text before it is stored, logged or returned.

Applied to stdout, stderr, error messages and tracebacks. Two sources of secrets:

* **Known formats**, a table of regular expressions below (`_RULES`): AWS access key ids and
  (in context) secret keys, OpenAI and Anthropic keys, GitHub tokens, Slack tokens and webhook
  URLs, JWTs, PEM private key blocks, Authorization / API-key headers, bearer tokens, passwords
  in URLs, secret query parameters, Google API keys, Stripe keys.
* **Registered values**: exact strings the caller passes (`Redactor(secrets)`), matched anywhere,
  also inside longer words, and in the escaped forms a program shows them in (`forms`): Python's
  repr and ascii() of a str or bytes, JSON (ASCII-only or not), URL-encoding and HTML; and a
  form's start or end shown alone, from `part_length` characters (half the form, within
  MIN_PART and MAX_PART), whatever follows or precedes it: displays cut values short with
  many marks (``...``, ``[...]``, ``[truncated]``, ``(more)``) or none (a slice, a column, a
  wrap), so no list of marks is complete; and a start and an end of a form shown together,
  each shorter than that (a masked display, `key[:6] + '...' + key[-6:]`: see MIN_PAIR).
  All forms and parts of all values are matched in one
  pass of one Aho-Corasick automaton (`ahocorasick_rs`), so the cost of a scan does not grow
  with the number of values.

Redaction defends against a secret shown by accident. It does not stop code that sets out to
leak one: a piece from the middle, an encoding (base64, reversed, spaced) or an escape of an
escape is not recognised.

Each secret becomes ``[REDACTED:<kind>]``; the text around it (header names, ``https://user:``,
``?token=``) stays, so output remains readable and diffable.

Why a hand-written table and not a pattern library: detect-secrets (Yelp), the maintained Python
option, was measured on this workload and does not fit. Its detectors work line by line and
yield the matched *strings*, not spans, so every hit would need a second search to locate it;
its 24 regex detectors (entropy and keyword plugins off) took ~530 ms per MiB of ordinary output,
ten times the budget; its private-key detector matches only the BEGIN line (the key body would
leak); it has no Anthropic, Google API key, Authorization header or URL query-token detectors;
and it pulls in requests and pyyaml. The table here is compact, returns spans directly, and is
fast because every expression starts with a literal, which lets the regex engine jump between
candidate positions with a substring search instead of trying the pattern at every character.
Keyword rules (``authorization``, ``api_key``...) run case-insensitively by matching lowercase
literals against a lowercased copy of the text with the same length, for the same reason.

False positives are kept rare by anchoring on vendor prefixes (``AKIA``, ``ghp_``, ``sk-ant-``,
``AIza``...) with exact lengths and word boundaries, by requiring a context keyword for formats
that are otherwise just random characters (the 40-character AWS secret key), and by requiring
generic credential values to look like one (8+ characters with a digit, or 20+). Hex digests,
UUIDs, base64 data, numbers and paths match no rule; tests/test_redact.py measures it.
"""

from __future__ import annotations

import bisect
import functools
import html
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import quote, quote_plus

from ahocorasick_rs import AhoCorasick, Implementation, MatchKind

from .contract import check_secrets
from .errors import UsageError

__all__ = [
    "DEFAULT",
    "MAX_GAP",
    "MAX_PART",
    "MIN_PAIR",
    "MIN_PART",
    "MIN_SECRET_LEN",
    "Finding",
    "Hole",
    "Redactor",
    "checked_secrets",
    "forms",
    "pair_need",
    "part_length",
    "refill",
]

# Registered values shorter than this are skipped, silently. A 1-3 character value ("1", "ab",
# "yes") occurs by chance all over ordinary output: redacting every occurrence would shred the
# output, and the pattern of redaction marks would itself reveal the value. Such a value is not
# a secret worth the name; callers register real credentials.
MIN_SECRET_LEN = 4

REGISTERED = "secret"  # the kind of a registered value
MIN_CUT_PREFIX = 3  # a cut secret's start this long or longer is redacted (see `redact_end`)
# A value's start or end shown without the rest (a display cut it short, with any mark or
# none; a slice; a wrap) is redacted from half its length, never from less than MIN_PART
# characters (a shorter run of a word-like value is ordinary text) and always from MAX_PART
# (that much of a long key is a leak however long the rest is). See `part_length`.
MIN_PART = 8
MAX_PART = 16
# A masked display (`key[:6] + '...' + key[-6:]`) shows a start and an end of a value, each
# shorter than its part, close together: such a pair is redacted when the two cover half the
# form (`pair_need`), each from MIN_PAIR characters, with at most MAX_GAP characters of marks,
# blanks, punctuation and at most MAX_GAP_BREAKS line breaks between them (`_GAP`).
MIN_PAIR = 3
MAX_GAP = 12
MAX_GAP_BREAKS = 2
_GAP = frozenset(" \t\r\n.\u2026*\u00b7\u2022#-_~/|[](){}<>,;:'\"`")
_LINE_BREAK = re.compile("[\r\n]")


@dataclass(frozen=True, slots=True)
class Finding:
    """One secret in a text: its kind and its span ``text[start:end]``."""

    kind: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Hole:
    """Where `Redactor.seal` put a placeholder: its offset in the sealed text, its kind, and
    the keyed digest of the UTF-8 text it replaced (enough to put a value given again back,
    and no offline test of guesses without the key)."""

    at: int
    kind: str
    digest: str
    # How many characters a start or an end of a registered value it replaced held (None for
    # a whole form or a pattern's match): refilling tries the one piece of each form that long
    # instead of every piece of every length, which costs time quadratic in the value.
    length: int | None = None


@dataclass(frozen=True, slots=True)
class _Rule:
    kind: str
    pattern: re.Pattern[str]
    lowered: bool  # matched against the lowercased text (keyword rules)
    groups: tuple[str, ...]  # named groups holding the secret; none = the whole match
    min_len: int  # no match is shorter: a shorter text is not scanned (most outputs are short)


# ---- building blocks -------------------------------------------------------------------------

# A token starts at a word start, or right after an escaped newline/tab in a JSON string or a
# Python repr ('...\nAKIA...'), where the character before it is the letter of the escape.
_ESC = r"\\[nrt]"


def _tok(prefix: str, rest: str, *, after: str = "A-Za-z0-9") -> str:
    """A token regex: literal `prefix` then `rest`, not glued to word characters on either side.

    The boundary check is a look-behind placed *after* the literal (the literal must come first
    so the regex engine can search for it quickly; see the module docstring).
    """
    lit = re.escape(prefix)
    return f"{lit}(?:(?<![A-Za-z0-9]{lit})|(?<={_ESC}{lit}))(?:{rest})(?![{after}])"


# Separator between a keyword and its value: `key: v`, `key=v`, `"key": "v"`, `'key': b'v'`,
# `key := v`, `key => v`.
_SEP = r"""["']?[ \t]*(?::=|=>|[:=])[ \t]*b?["']?"""
# RFC 7235 token68, as carried after `Bearer` / `Basic` (lowercased text). It does not end on a
# dot, so the full stop after "... Bearer <token>." stays.
_TOKEN68 = r"[a-z0-9._~+/-]*[a-z0-9_~+/-]=*"
# A credential value in a generic keyword context: a token68, 8+ long, with a digit or 20+ long,
# so `api_key=None`, `access_token: str` and `bearer of bad news` stay.
_CRED = r"(?=[a-z0-9._~+/-]*[0-9]|[a-z0-9._~+/-]{20})(?=[a-z0-9._~+/-]{8})" + _TOKEN68
# A URL query value: unreserved and percent-encoded characters plus the base64 ones, not ending
# on a dot or colon, so punctuation after a URL in prose stays.
_QUERY_VALUE = r"[a-z0-9._~%+/=:@!$*-]*[a-z0-9_~%+/=@!$*-]"


def _rule(kind: str, regex: str, *, lowered: bool = False) -> _Rule:
    pattern = re.compile(regex, re.VERBOSE)
    groups = tuple(sorted(pattern.groupindex, key=pattern.groupindex.__getitem__))
    return _Rule(kind, pattern, lowered, groups, _min_width(regex, re.VERBOSE))


def _min_width(regex: str, flags: int) -> int:
    """The fewest characters a match of `regex` spans, from the regex parser `re` itself
    uses (lookarounds count as none); 0, so the rule is always run, where it cannot tell."""
    try:
        from re import _parser  # type: ignore[attr-defined]  # CPython's own, 3.11+

        return max(0, int(_parser.parse(regex, flags).getwidth()[0]))
    except Exception:  # noqa: BLE001 - another implementation: no shortcut, same result
        return 0


def _keyword(kind: str, lead: str, tails: str, value: str) -> _Rule:
    """A rule for `<lead><tail><separator><value>` on the lowercased text; the value is redacted.

    Field names sharing a `lead` ("api" for api_key, api-key, apikey) share one rule, hence one
    scan of the text.
    """
    w = re.escape(lead)
    return _rule(kind, f"{w}(?<![a-z0-9]{w})(?:{tails}){_SEP}(?P<s>{value})", lowered=True)


# ---- the table -------------------------------------------------------------------------------
# Order is priority: when two rules cover the same span, the earlier kind names the redaction.

_AUTH_SCHEMES_TOKEN = "bearer|basic|token|bot|apikey|api-key|sso-key|jwt|dpop"
_AUTH_SCHEMES_PARAMS = (
    "digest|aws4-hmac-sha256|negotiate|ntlm|hawk|hoba|mutual|vapid|scram-sha-1|scram-sha-256|gnap"
)
_QUERY_NAMES = (
    "access_token|refresh_token|id_token|auth_token|private_token|token|api_key|apikey|api-key"
    "|client_secret|secret|password|passwd|pwd|x-amz-signature|x-amz-security-token"
    "|x-amz-credential|signature|sig"
)
_CRED_FIELDS = {  # lead: tails
    "api": "[_-]?key",
    "auth": "[_-]token",
    "access": "[_-]token",
    "refresh": "[_-]token",
    "private": "[_-]token",
    "client": "[_-]secret",
}

# Between PEM lines: newlines, escaped newlines (JSON, repr) or blanks. One `+` over alternatives
# that consume distinct characters, so there is a single way to split a run (no backtracking blowup).
_PEM_SEP = r"(?:[ \t\r\n]|\\[rn])+"
# RFC 1421 / OpenPGP armour headers inside a private key block.
_PEM_HEADER = r"(?:Proc-Type|DEK-Info|Comment|Version|Hash|Charset):[^\r\n\\]{0,200}"

_RULES: tuple[_Rule, ...] = (
    # PEM private keys (RSA, EC, DSA, OPENSSH, ENCRYPTED, PGP ...), BEGIN line to END line. The
    # body is matched line by line (base64 lines and armour headers, separated by newlines, by
    # escaped newlines as in JSON or a repr, or by spaces) rather than by "anything up to END",
    # so the cost stays linear even with many BEGIN lines and no END. If the END line is missing
    # (output cut off), the BEGIN line and the 16+ character base64 lines after it are redacted;
    # shorter lines are not taken then, since they may be ordinary output.
    _rule(
        "private_key",
        rf"""
        -----BEGIN[ ][A-Z0-9 ]*PRIVATE[ ]KEY(?:[ ]BLOCK)?-----
        (?: (?:{_PEM_SEP}(?:[A-Za-z0-9+/=]+|{_PEM_HEADER}))*
            {_PEM_SEP}?-----END[ ][A-Z0-9 ]*PRIVATE[ ]KEY(?:[ ]BLOCK)?-----
          | (?:{_PEM_SEP}(?:[A-Za-z0-9+/=]{{16,}}|=[A-Za-z0-9+/]{{4}}|{_PEM_HEADER}))*
        )""",
    ),
    # AWS access key ids: AKIA (long-term), ASIA (STS), ABIA, ACCA, A3T* + 16 upper alnum.
    _rule("aws_access_key", _tok("A", r"(?:KIA|SIA|BIA|CCA|3T[A-Z0-9])[A-Z0-9]{16}")),
    # AWS secret access keys are 40 base64 characters with no prefix: recognised only after a
    # secret-key keyword (aws_secret_access_key, SecretAccessKey, --aws-secret-access-key, ...).
    _rule(
        "aws_secret_key",
        r"""
        secret[_ -]?(?:access[_ -]?)?key(?:["']?[ \t]*(?::=|=>|[:=])[ \t]*b?["']?|[ \t]+)
        (?P<s>[a-z0-9/+]{40})(?![a-z0-9+=])""",
        lowered=True,
    ),
    # Anthropic: sk-ant-api03-..., sk-ant-admin01-..., sk-ant-oat01-...
    _rule("anthropic_key", _tok("sk-ant-", r"[A-Za-z0-9_-]{20,}", after="A-Za-z0-9_-")),
    # OpenAI: sk-proj-..., sk-svcacct-..., sk-admin-..., legacy sk-<48>. At least 20 characters
    # and a digit, so slugs such as `sk-learn-...` stay.
    _rule(
        "openai_key",
        _tok("sk-", r"(?!ant-)(?=[A-Za-z0-9_-]*[0-9])[A-Za-z0-9_-]{20,}", after="A-Za-z0-9_-"),
    ),
    # GitHub: personal (ghp_), OAuth (gho_), user-to-server (ghu_), server (ghs_), refresh (ghr_).
    _rule("github_token", _tok("gh", r"[pousr]_[A-Za-z0-9]{36,}")),
    _rule("github_token", _tok("github_pat_", r"[A-Za-z0-9_]{22,}", after="A-Za-z0-9_")),
    # Slack: xoxb-, xoxp-, xoxa-, xoxr-, xoxs-, xoxe.xoxp-...; app-level tokens xapp-.
    _rule(
        "slack_token", _tok("xox", r"[a-z](?:\.xox[a-z])?-[A-Za-z0-9-]{10,}", after="A-Za-z0-9-")
    ),
    _rule("slack_token", _tok("xapp-", r"[0-9]-[A-Za-z0-9-]{10,}", after="A-Za-z0-9-")),
    # Slack webhook URLs: the path is the credential; scheme and host stay.
    _rule(
        "slack_webhook",
        r"hooks\.slack\.com/(?:services|workflows|triggers)/(?P<s>[A-Za-z0-9_/+-]{8,})",
    ),
    # JWT / JWS (header.payload.signature) and JWE (5 parts); the header is base64url of '{"'.
    # The signature may be empty (alg "none"); JWE parts after the third must not be, so a full
    # stop after a token stays.
    _rule(
        "jwt",
        _tok(
            "eyJ",
            r"[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"
            r"(?:\.[A-Za-z0-9_-]+){0,2}",
            after="A-Za-z0-9_-",
        ),
    ),
    # Google API keys.
    _rule("google_api_key", _tok("AIza", r"[A-Za-z0-9_-]{35}", after="A-Za-z0-9_-")),
    # Stripe secret and restricted keys (live and test mode).
    _rule("stripe_key", _tok("sk_", r"(?:live|test)_[A-Za-z0-9]{20,}")),
    _rule("stripe_key", _tok("rk_", r"(?:live|test)_[A-Za-z0-9]{20,}")),
    # Authorization / Proxy-Authorization headers, also as dict or JSON keys: keep the name and
    # the scheme, redact the credentials.
    _rule(
        "authorization",
        rf"""
        authorization(?<![a-z0-9_]authorization){_SEP}
        (?: (?:{_AUTH_SCHEMES_TOKEN})[ \t]+(?P<s>{_TOKEN68})
          | (?:{_AUTH_SCHEMES_PARAMS})[ \t]+(?P<s2>[^\r\n"']+)
          | (?P<s3>{_CRED})
        )""",
        lowered=True,
    ),
    # A bearer token anywhere ("Bearer <token>" in logs, curl commands, reprs).
    _rule("bearer_token", rf"bearer(?<![a-z0-9_]bearer)[ \t]+(?P<s>{_CRED})", lowered=True),
    # Passwords in URLs: scheme://user:password@host. Greedy up to the last '@' of the authority,
    # since an unencoded '@' inside a password is common.
    _rule(
        "url_password",
        r"""
        ://(?<=[A-Za-z0-9+.-]://)[^\s:/?#@"'<>]*:(?P<s>[^\s/?#"'<>]+)@""",
    ),
    # Secret query or fragment parameters: ?token=..., &api_key=..., #access_token=... (OAuth).
    *(
        _rule(
            "url_param",
            rf"{re.escape(c)}(?:amp;)?(?:{_QUERY_NAMES})=(?P<s>{_QUERY_VALUE})",
            lowered=True,
        )
        for c in "?&#"
    ),
    # API keys and tokens in header / assignment / JSON context: X-API-Key: ..., "api_key": ...
    *(_keyword("credential", lead, tails, _CRED) for lead, tails in _CRED_FIELDS.items()),
)

_KINDS = tuple(dict.fromkeys([*(r.kind for r in _RULES), REGISTERED]))

# Placeholders already in the text are never redacted again (that is what makes redaction
# idempotent). Only the exact marks this module writes count, so a program cannot shield a
# secret by printing "[REDACTED:" in front of it.
_PLACEHOLDER = re.compile(r"\[REDACTED:(?:" + "|".join(_KINDS) + r")\]")


def _lower_same_length(text: str) -> str:
    """`text.lower()` with the same length, so spans found in it are spans of `text`.

    U+0130 (dotted capital I) is the only code point whose lowercase is two characters.
    """
    lowered = text.lower()
    if len(lowered) != len(text):
        lowered = text.replace("\u0130", "i").lower()
    return lowered


def forms(value: str) -> tuple[str, ...]:
    """The texts `value` becomes when a program shows it, `value` first, each once: inside a
    Python str or bytes literal (repr and ascii(), with a quote escaped or not: repr escapes
    ' only when the whole string holds both quotes), in JSON (`json.dumps`, ASCII-only or
    not), URL-encoded (`quote`, with and without '/' kept, and `quote_plus`) and HTML-escaped
    (quotes too, or only & < > as in a DataFrame's text/html). Escapes of escapes (the JSON of
    a repr) are not among them."""
    out = [
        value,
        repr(value)[1:-1],
        repr('"' + value)[2:-1],
        ascii(value)[1:-1],
        ascii('"' + value)[2:-1],
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
        html.escape(value),
        html.escape(value, quote=False),
    ]
    try:
        raw = value.encode()
    except UnicodeEncodeError:  # a lone surrogate has no UTF-8: no bytes or URL form
        return tuple(dict.fromkeys(out))
    out += [
        repr(raw)[2:-1],
        repr(b'"' + raw)[3:-1],
        quote(raw, safe=""),
        quote(raw),
        quote_plus(raw),
    ]
    return tuple(dict.fromkeys(out))


# Lone surrogates (bytes that were not UTF-8, decoded with surrogateescape) have no UTF-8 for
# the automaton: each becomes U+FFFD, one character for one, in the text and in the patterns.
_SURROGATE = re.compile("[\ud800-\udfff]")
# Of the redactors built per request, those whose forms are this small are kept for reuse
# (a caller sends the same few secrets with every run); larger ones are built each time.
_CACHED_FORMS_CHARS = 16 * 1024


def part_length(form: str) -> int:
    """How long a start or an end of `form` shown alone must be to be redacted: half of it,
    within MIN_PART and MAX_PART (a form no longer than that has no part but itself)."""
    return max(MIN_PART, min(len(form) // 2, MAX_PART))


def pair_need(form: str) -> int:
    """How many characters a start and an end of `form` shown together (`MIN_PAIR`) must
    cover between them to be redacted: half of it, never more than MAX_PART."""
    return max(2 * MIN_PAIR, min(len(form) // 2, MAX_PART))


def _last_line(text: str) -> str:
    return text[max(text.rfind("\n"), text.rfind("\r")) + 1 :]


_CHUNK = 64  # characters compared at once while following a value


def _common_prefix(text: str, at: int, line: str) -> int:
    """How many characters of `text` from `at` are the start of `line`."""
    limit = min(len(line), len(text) - at)
    if text.startswith(line[:limit], at):
        return limit
    n = 0
    while n + _CHUNK <= limit and text.startswith(line[n : n + _CHUNK], at + n):
        n += _CHUNK
    for x, y in zip(text[at + n : at + n + _CHUNK], line[n : n + _CHUNK], strict=False):
        if x != y:
            break
        n += 1
    return n


def _common_suffix(text: str, end: int, line: str) -> int:
    """How many characters of `text` before `end` are the end of `line`."""
    size = len(line)
    limit = min(size, end)
    if text[end - limit : end] == line[size - limit :]:
        return limit
    n = 0
    while (
        n + _CHUNK <= limit
        and text[end - n - _CHUNK : end - n] == line[size - n - _CHUNK : size - n]
    ):
        n += _CHUNK
    for x, y in zip(
        reversed(text[max(0, end - n - _CHUNK) : end - n]),
        reversed(line[max(0, size - n - _CHUNK) : size - n]),
        strict=False,
    ):
        if x != y:
            break
        n += 1
    return n


def _coalesced(
    hits: list[tuple[int, int, int]], before: int, after: int, size: int
) -> list[tuple[int, int]]:
    """The union of the spans from `before` characters before each hit to `after` after it."""
    out: list[tuple[int, int]] = []
    lo, hi = hits[0][1] - before, hits[0][2] + after
    for _, s, e in hits:
        if s - before > hi:
            out.append((max(0, lo), min(size, hi)))
            lo = s - before
        hi = e + after
    out.append((max(0, lo), min(size, hi)))
    return out


def _gap_ends(text: str, at: int) -> list[int]:
    """Where a run of marks from `at` may end (`at` itself first): at most MAX_GAP of them,
    with at most MAX_GAP_BREAKS line breaks."""
    return _gap(text, at, range(at, min(len(text), at + MAX_GAP)), 1)


def _gap_starts(text: str, at: int) -> list[int]:
    """Where a run of marks ending at `at` may start (`at` itself first); see `_gap_ends`."""
    return _gap(text, at, range(at - 1, max(-1, at - 1 - MAX_GAP), -1), 0)


def _gap(text: str, at: int, positions: range, past: int) -> list[int]:
    """The bounds of a run of marks met walking `positions` away from `at`: each mark read
    moves the bound to its own position plus `past` (1 walking forwards, 0 backwards)."""
    out, breaks = [at], 0
    for pos in positions:
        c = text[pos]
        if c not in _GAP:
            break
        breaks += c in "\r\n"
        if breaks > MAX_GAP_BREAKS:
            break
        out.append(pos + past)
    return out


class _Matcher:
    """Every form of every registered value, and every start or end of a form at least
    `part_length` long, found in one pass of one Aho-Corasick automaton.

    The automaton holds the forms whole and, for each form, its first and last `part_length`
    characters (its parts); a part's match is then widened along its form as far as the text
    follows it. Parts stop at a line break, so live output, redacted line by line, finds the
    same spans. The automaton reports leftmost-longest matches without overlap; an occurrence
    that starts inside a reported one and runs past it ("abab" twice in "ababab") is found by
    `_extend`, so the spans cover every occurrence, as the union of their spans."""

    def __init__(self, values: tuple[str, ...]) -> None:
        found = {f for v in values for f in forms(v)}
        self.forms = tuple(sorted(found, key=lambda f: (-len(f), f)))
        self.form_set = frozenset(found)
        # Characters a form's cut start can end on (see `Redactor.redact_end`): most outputs
        # end on a line break, which none holds, and need no look at the forms.
        self.cut_ends = frozenset(c for f in self.forms for c in f[MIN_CUT_PREFIX - 1 : -1])
        # The mirror, for text cut at its start (see `Redactor.redact_start`).
        self.cut_starts = frozenset(
            c for f in self.forms for c in f[1 : len(f) - MIN_CUT_PREFIX + 1]
        )
        self._reach = len(self.forms[0]) - 1  # how far past a match an overlapping one can end
        # Each pattern with the lines it starts (a form's first line, followed forward from a
        # match) and ends (a form's last line, followed backward).
        starts: dict[str, list[str]] = {f: [] for f in self.forms}
        ends: dict[str, list[str]] = {f: [] for f in self.forms}
        for f in self.forms:
            n = part_length(f)
            if len(f) <= n:
                continue
            first, last = _LINE_BREAK.split(f, maxsplit=1)[0], _last_line(f)
            if len(first) >= n:
                starts.setdefault(first[:n], []).append(first)
                ends.setdefault(first[:n], [])
            if len(last) >= n:
                ends.setdefault(last[-n:], []).append(last)
                starts.setdefault(last[-n:], [])
        patterns = tuple(starts)
        self._starts = tuple(tuple(starts[p]) for p in patterns)
        self._ends = tuple(tuple(ends[p]) for p in patterns)
        self._automaton = AhoCorasick(
            [_SURROGATE.sub("\ufffd", p) for p in patterns],
            matchkind=MatchKind.LeftmostLongest,
            # Builds in tens of microseconds for a few values (the DFA takes ten times more),
            # and scans as fast as the others on output.
            implementation=Implementation.ContiguousNFA,
        )
        self._pairs_setup()

    def _pairs_setup(self) -> None:
        """A second automaton for masked displays: each form's start and end anchors (half of
        `pair_need`, so one of a pair's pieces holds one), found with overlaps; and, for
        live output, each start piece by its last MIN_PAIR characters (`pair_hold`)."""
        info: dict[str, list[int]] = {}  # anchor: indexes in _pair_info
        self._pair_info: list[tuple[str, str, bool, int, int, int]] = []
        # Every start piece by its last MIN_PAIR characters, every end piece by its first.
        self._start_tails: dict[str, list[str]] = {}
        self._end_heads: dict[str, list[str]] = {}
        for f in self.forms:
            first, last = _LINE_BREAK.split(f, maxsplit=1)[0], _last_line(f)
            # A piece may be a part too (redacted alone); up to twice MAX_PART, the other one,
            # shorter, is redacted with it.
            top = min(2 * MAX_PART, len(f) - 1)
            a_max, b_max, need = min(top, len(first)), min(top, len(last)), pair_need(f)
            q = max(MIN_PAIR, -(-need // 2))
            if a_max + b_max < need:
                continue
            for is_start, anchor in ((True, first[:q]), (False, last[-q:])):
                if (a_max if is_start else b_max) >= q:
                    info.setdefault(anchor, []).append(len(self._pair_info))
                    self._pair_info.append((first, last, is_start, need, a_max, b_max))
            for a in range(MIN_PAIR, a_max + 1):
                tails = self._start_tails.setdefault(first[a - MIN_PAIR : a], [])
                if first[:a] not in tails:
                    tails.append(first[:a])
            for b in range(MIN_PAIR, b_max + 1):
                heads = self._end_heads.setdefault(last[-b:][:MIN_PAIR], [])
                if last[-b:] not in heads:
                    heads.append(last[-b:])
        anchors = tuple(info)
        self._anchor_info = tuple(tuple(info[a]) for a in anchors)
        self._anchors: tuple[AhoCorasick, AhoCorasick] | None = None
        if anchors:
            clean = [_SURROGATE.sub("\ufffd", a) for a in anchors]
            # Leftmost-longest skips ahead fast on ordinary text (overlapping search is four
            # times slower); the anchors overlapping a hit are then found in its window.
            self._anchors = (
                AhoCorasick(
                    clean,
                    matchkind=MatchKind.LeftmostLongest,
                    implementation=Implementation.ContiguousNFA,
                ),
                AhoCorasick(clean, implementation=Implementation.ContiguousNFA),
            )
            self._anchor_reach = max(map(len, anchors))

    def _pairs(
        self, text: str, covered: list[tuple[int, int]] | None = None
    ) -> list[tuple[int, int]]:
        """The spans of the pieces of every masked display of a form in `text` (a start and
        an end shown together: see MIN_PAIR), unsorted. A hit inside a span of `covered`
        (sorted, disjoint: what is redacted already, a whole value repeated) is no pair's."""
        if self._anchors is None:
            return []
        covered = covered or []
        covered_starts = [c[0] for c in covered]

        def inside(s: int, e: int) -> bool:
            i = bisect.bisect_right(covered_starts, s) - 1
            return i >= 0 and e <= covered[i][1]

        try:
            first_hits = self._anchors[0].find_matches_as_indexes(text)
        except UnicodeEncodeError:
            text = _SURROGATE.sub("\ufffd", text)
            first_hits = self._anchors[0].find_matches_as_indexes(text)
        out: list[tuple[int, int]] = []
        # A piece is tried once, from its longest hit (a hit inside it finds nothing more).
        # Hostile text (a value's start repeated) hits at every character: past this much
        # work, each hit's neighbourhood that a pair through it could cover is redacted
        # instead (more, never less).
        budget = len(text) // 16 + (1 << 19)  # in characters compared
        wide = 4 * MAX_PART + MAX_GAP  # a start piece, a gap, an end piece
        starts: dict[tuple[int, int], int] = {}  # (info, piece end): piece start
        ends: dict[tuple[int, int], int] = {}  # (info, piece start): piece end
        reach = self._anchor_reach
        for k, (_, s, e) in enumerate(first_hits):
            if covered and inside(s, e):
                continue
            budget -= 2 * reach
            if budget < 0:
                out += _coalesced(first_hits[k:], wide, reach + wide, len(text))
                break
            window = text[s : e + reach - 1]  # anchors overlapping this one
            for i, a, b in self._anchors[1].find_matches_as_indexes(window, overlapping=True):
                if s + a >= e or (covered and inside(s + a, s + b)):  # the next hit's; redacted
                    continue
                for info in self._anchor_info[i]:
                    first, last, is_start, _need, a_max, b_max = self._pair_info[info]
                    budget -= a_max + b_max
                    if is_start:
                        n = _common_prefix(text, s + a, first[: a_max + 1])
                        if n <= a_max:
                            starts.setdefault((info, s + a + n), s + a)
                    else:
                        n = _common_suffix(text, s + b, last[len(last) - b_max - 1 :])
                        if n <= b_max:
                            ends[info, s + b - n] = s + b
        return out + self._completed(text, starts, ends, budget)

    def _completed(
        self,
        text: str,
        starts: dict[tuple[int, int], int],
        ends: dict[tuple[int, int], int],
        budget: int,
    ) -> list[tuple[int, int]]:
        """The spans of the pairs the pieces found (`_pairs`) complete, within `budget`."""
        out: list[tuple[int, int]] = []
        wide = 4 * MAX_PART + MAX_GAP
        for found, is_start in ((starts, True), (ends, False)):
            for (info, at), other in found.items():
                s, e = (other, at) if is_start else (at, other)
                if budget < 0:
                    out.append((max(0, s - wide), min(len(text), e + wide)))
                    continue
                spans, cost = self._pair_at(text, s, e, self._pair_info[info])
                out += spans
                budget -= cost
        return out

    def _pair_at(
        self, text: str, s: int, e: int, info: tuple[str, str, bool, int, int, int]
    ) -> tuple[list[tuple[int, int]], int]:
        """The spans of a pair whose start piece (or end piece, as `info` says) is
        text[s:e], and how many comparisons finding it took."""
        first, last, is_start, need, _a_max, _b_max = info
        low = max(MIN_PAIR, need - (e - s))
        tries = 0
        if is_start:
            for g in _gap_ends(text, e):
                best = 0
                for piece in self._end_heads.get(text[g : g + MIN_PAIR], ()):
                    tries += len(piece)
                    if (
                        len(piece) >= max(low, best + 1)
                        and last.endswith(piece)
                        and text.startswith(piece, g)
                    ):
                        best = len(piece)
                if best:
                    return [(s, e), (g, g + best)], tries
        else:
            for g in _gap_starts(text, s):
                best = 0
                for piece in self._start_tails.get(text[max(0, g - MIN_PAIR) : g], ()):
                    tries += len(piece)
                    if (
                        len(piece) >= max(low, best + 1)
                        and first.startswith(piece)
                        and text.startswith(piece, g - len(piece))
                    ):
                        best = len(piece)
                if best:
                    return [(g - best, g), (s, e)], tries
        return [], tries

    def pair_hold(self, text: str, cut: int) -> int:
        """`cut`, or the start of a form's start piece that only marks and at most
        MAX_GAP_BREAKS line breaks separate from `cut` (its end piece may follow it)."""
        held = cut
        for g in _gap_starts(text, cut):
            for piece in self._start_tails.get(text[g - MIN_PAIR : g], ()) if g >= MIN_PAIR else ():
                if text.startswith(piece, g - len(piece)):
                    held = min(held, g - len(piece))
        if held == cut:
            return cut
        # With the text after `cut` known as far as a pair could reach, hold only for a pair
        # that is there: a start piece on every line must not hold them all.
        reach = cut + MAX_GAP + 2 * MAX_PART + 1
        if reach >= len(text):
            return held
        spans = self._pairs(text[held:reach])  # a start piece's span, then its end piece's
        at = cut - held
        return (
            held
            if any(spans[i][0] < at < spans[i + 1][1] for i in range(0, len(spans) - 1, 2))
            else cut
        )

    def _find(self, text: str) -> list[tuple[int, int, int]]:
        try:
            return self._automaton.find_matches_as_indexes(text)
        except UnicodeEncodeError:
            return self._automaton.find_matches_as_indexes(_SURROGATE.sub("\ufffd", text))

    def _widen(
        self, text: str, index: int, start: int, end: int, budget: int
    ) -> tuple[int, int, int]:
        """The span of a pattern's match widened along the forms it starts or ends, and the
        budget left (each form followed costs it); past the budget, widened as far as any
        form could reach instead (more is redacted, never less)."""
        starts, ends = self._starts[index], self._ends[index]
        if budget < 0:
            return (
                max(0, end - self._reach - 1) if ends else start,
                min(len(text), start + self._reach + 1) if starts else end,
                budget,
            )
        widened_start, widened_end = start, end
        for line in starts:
            n = _common_prefix(text, start, line)
            budget -= n + _CHUNK
            widened_end = max(widened_end, start + n)
        for line in ends:
            n = _common_suffix(text, end, line)
            budget -= n + _CHUNK
            widened_start = min(widened_start, end - n)
        return widened_start, widened_end, budget

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Spans covering every occurrence of a form, and of a start or an end of one at least
        `part_length` long, in `text`: sorted and disjoint."""
        spans: list[tuple[int, int]] = []
        # Following forms and extending spans rescans the text: at most this much of it in
        # all, so a hostile text (a value overlapping itself at every character, a value's
        # start repeated) stays linear. Past it, each match is widened by the longest a form
        # overlapping it could reach: the same occurrences covered, and some text around them.
        budget = 8 * len(text) + (1 << 20)
        for index, start, end in self._find(text):
            if spans and start < spans[-1][1] and budget >= 0:
                continue  # what starts in an extended span ends in it (`_extend`)
            start, end, budget = self._widen(text, index, start, end, budget)
            if budget < 0:
                end = min(len(text), end + self._reach)
            else:
                start, end, budget = self._extend(text, start, end, budget)
            # A span widened backward (a value's end) may reach over the spans before it.
            while spans and start < spans[-1][1]:
                start, end = min(start, spans[-1][0]), max(end, spans.pop()[1])
            spans.append((start, end))
        pairs = self._pairs(text, spans)
        if not pairs:
            return spans
        merged: list[tuple[int, int]] = []
        for start, end in sorted(spans + pairs):
            if merged and start < merged[-1][1]:
                merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
            else:
                merged.append((start, end))
        return merged

    def _extend(self, text: str, start: int, end: int, budget: int) -> tuple[int, int, int]:
        """The span moved past every occurrence that starts in `text[start:end]` and ends
        after it (repeatedly, as such an occurrence may itself be overlapped); the budget
        left."""
        pos = start + 1
        while pos < end < len(text):
            hi = min(len(text), end + self._reach)
            budget -= hi - pos
            if budget < 0:
                return start, hi, budget
            first = self._find(text[pos:hi])
            if not first or pos + first[0][1] >= end:
                break
            index, a, b = first[0]
            s, e, budget = self._widen(text, index, pos + a, pos + b, budget)
            start, end = min(start, s), max(end, e)
            pos += a + 1
        return start, end, budget


@functools.lru_cache(maxsize=64)
def _cached_matcher(values: tuple[str, ...]) -> _Matcher:
    return _Matcher(values)


def _matcher(values: tuple[str, ...]) -> _Matcher | None:
    if not values:
        return None
    if sum(map(len, values)) * 4 <= _CACHED_FORMS_CHARS:
        return _cached_matcher(values)
    return _Matcher(values)


def _subtract(
    spans: list[tuple[int, int, int, str]], holes: list[tuple[int, int]]
) -> list[tuple[int, int, int, str]]:
    """`spans` with the parts inside `holes` (sorted, disjoint) removed."""
    out: list[tuple[int, int, int, str]] = []
    for start, end, prio, kind in spans:
        for h_start, h_end in holes:
            if h_end <= start or h_start >= end:
                continue
            if h_start > start:
                out.append((start, h_start, prio, kind))
            start = max(start, h_end)
            if start >= end:
                break
        if start < end:
            out.append((start, end, prio, kind))
    return out


class Redactor:
    """Finds and replaces secrets in text. Immutable and thread-safe; build once, reuse."""

    def __init__(self, secrets: Iterable[str] = (), *, patterns: bool = True) -> None:
        """`secrets`: exact values to redact wherever they occur (also inside longer strings).
        `patterns=False`: only those, not the known formats.

        Values shorter than `MIN_SECRET_LEN` characters are skipped without a warning (see
        `MIN_SECRET_LEN` for why).
        """
        kept = {s for s in secrets if len(s) >= MIN_SECRET_LEN}
        self._secrets: tuple[str, ...] = tuple(sorted(kept, key=lambda s: (-len(s), s)))
        self._matcher = _matcher(self._secrets)  # None without registered values: no cost
        self._rules = _RULES if patterns else ()

    @property
    def secrets(self) -> tuple[str, ...]:
        """The registered values (those long enough to be kept), longest first."""
        return self._secrets

    @property
    def forms(self) -> tuple[str, ...]:
        """Every text redacted as a registered value: each value and its escaped `forms`,
        longest first."""
        return self._matcher.forms if self._matcher is not None else ()

    def with_secrets(self, more: Iterable[str]) -> Redactor:
        """A Redactor that also redacts the values in `more` (this one when there are none:
        it is immutable)."""
        more = tuple(more)
        return Redactor((*self._secrets, *more), patterns=bool(self._rules)) if more else self

    def registered_only(self) -> Redactor:
        """A Redactor for the same registered values and no known formats."""
        return Redactor(self._secrets, patterns=False)

    # Complex on purpose: one pass of the automaton, whole values and parts, within one budget.
    def findings(self, text: str) -> list[Finding]:  # noqa: C901
        """The secrets in `text`, sorted, non-overlapping (overlapping hits merged)."""
        if not text:
            return []
        raw: list[tuple[int, int, int, str]] = []  # (start, end, priority, kind)
        if self._matcher is not None:
            raw.extend((s, e, 0, REGISTERED) for s, e in self._matcher.spans(text))
        lowered: str | None = None
        for prio, rule in enumerate(self._rules, start=1):
            if rule.min_len > len(text):
                continue
            if rule.lowered:
                if lowered is None:
                    lowered = _lower_same_length(text)
                subject = lowered
            else:
                subject = text
            for m in rule.pattern.finditer(subject):
                start, end = m.span()
                for g in rule.groups:
                    if m.start(g) != -1:
                        start, end = m.span(g)
                        break
                if end > start:
                    raw.append((start, end, prio, rule.kind))
        if not raw:
            return []
        if "[REDACTED:" in text:
            raw = _subtract(raw, [m.span() for m in _PLACEHOLDER.finditer(text)])
        raw.sort(key=lambda f: (f[0], -f[1], f[2]))
        merged: list[Finding] = []
        for start, end, _prio, kind in raw:
            if merged and start < merged[-1].end:
                last = merged[-1]
                if end > last.end:
                    merged[-1] = Finding(last.kind, last.start, end)
                continue
            merged.append(Finding(kind, start, end))
        return merged

    def redact(self, text: str) -> str:
        """`text` with every secret replaced by ``[REDACTED:<kind>]``.

        Registered values become ``[REDACTED:secret]``. Idempotent: redacting the result again
        changes nothing.
        """
        found = self.findings(text)
        if not found:
            return text
        parts: list[str] = []
        pos = 0
        for f in found:
            parts.append(text[pos : f.start])
            parts.append(f"[REDACTED:{f.kind}]")
            pos = f.end
        parts.append(text[pos:])
        return "".join(parts)

    def pair_hold(self, text: str, cut: int) -> int:
        """`cut`, or where text released up to `cut` must stop: the start of a registered
        value's start piece that an end piece after `cut` could complete (a masked display
        across a line break, see MIN_PAIR)."""
        return self._matcher.pair_hold(text, cut) if self._matcher is not None else cut

    def redact_end(self, text: str) -> str:
        """`redact(text)` for text that ends a stream: an output cut at its cap (or a program
        ending mid-write) may end with the start of a registered secret, which no longer
        matches it whole; that start is redacted too, from MIN_CUT_PREFIX characters on."""
        text = self.redact(text)
        if self._matcher is None or not text or text[-1] not in self._matcher.cut_ends:
            return text
        cut = max(_cut_start(text, form) for form in self._matcher.forms)
        return text[:-cut] + "[REDACTED:secret]" if cut else text

    def redact_start(self, text: str) -> str:
        """`redact(text)` for text cut at its start (the kept tail of a traceback): it may
        begin with the end of a registered secret, which is redacted too, from MIN_CUT_PREFIX
        characters on. For text cut in the middle, apply this to the part after the cut and
        `redact_end` to the part before it."""
        text = self.redact(text)
        if self._matcher is None or not text or text[0] not in self._matcher.cut_starts:
            return text
        cut = max(_cut_end(text, form) for form in self._matcher.forms)
        return "[REDACTED:secret]" + text[cut:] if cut else text

    def seal(self, text: str, digest: Callable[[bytes], str]) -> tuple[str, list[Hole]]:
        """`redact(text)`, and a `Hole` for each placeholder it wrote (none: `text` itself),
        with `digest` of the UTF-8 of what it replaced."""
        found = self.findings(text)
        if not found:
            return text, []
        parts: list[str] = []
        holes: list[Hole] = []
        pos = at = 0
        for f in found:
            parts.append(text[pos : f.start])
            at += f.start - pos
            mark = f"[REDACTED:{f.kind}]"
            parts.append(mark)
            piece = text[f.start : f.end]
            whole = f.kind != REGISTERED or self._matcher is None or piece in self._matcher.form_set
            holes.append(Hole(at, f.kind, digest(_utf8(piece)), None if whole else len(piece)))
            at += len(mark)
            pos = f.end
        parts.append(text[pos:])
        return "".join(parts), holes


def _cut_start(text: str, value: str) -> int:
    """The longest k, at least MIN_CUT_PREFIX and less than len(value), with `text` ending in
    `value[:k]`; 0 if none. Only the last len(value) - 1 characters are looked at."""
    tail = text[max(0, len(text) - len(value) + 1) :] if len(value) > 1 else ""
    head = value[:MIN_CUT_PREFIX]
    at = tail.find(head)
    while at != -1:
        if value.startswith(tail[at:]):
            return len(tail) - at
        at = tail.find(head, at + 1)
    return 0


def _cut_end(text: str, value: str) -> int:
    """The longest k, at least MIN_CUT_PREFIX and less than len(value), with `text` starting
    with `value[-k:]`; 0 if none. Only the first len(value) - 1 characters are looked at."""
    head = text[: len(value) - 1]
    tail = value[-MIN_CUT_PREFIX:] if len(value) > MIN_CUT_PREFIX else ""
    at = head.rfind(tail) if tail else -1
    while at != -1:
        end = at + MIN_CUT_PREFIX
        if value.endswith(head[:end]):
            return end
        at = head.rfind(tail, 0, end - 1)
    return 0


def checked_secrets(secrets: Iterable[str]) -> tuple[str, ...]:
    """The secrets one request registers, within the caps of `contract.check_secrets` (a
    flood of values would cost every result), else UsageError naming the cap."""
    try:
        return check_secrets(secrets)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def refill(
    sealed: str, holes: Iterable[Hole], values: Iterable[str], digest: Callable[[bytes], str]
) -> tuple[str, int]:
    """Put `values` back into the holes of a sealed text, each where its `digest` matches.
    Returns the text and how many holes no value fits (those keep their placeholder)."""
    # A hole may hold a value as the redactor found it: escaped (a literal in the code).
    values = tuple(values)
    by_hash = {digest(_utf8(f)): f for v in values for f in forms(v)}
    with_parts = False
    parts: list[str] = []
    pos = missing = 0
    for hole in holes:
        mark = f"[REDACTED:{hole.kind}]"
        value = by_hash.get(hole.digest)
        if value is None and hole.length is not None:  # a start or an end of one this long
            value = _piece_of_length(values, hole.length, hole.digest, digest)
        if value is None and not with_parts:  # an older record's piece: any length
            by_hash.update(_part_digests(values, digest))
            with_parts = True
            value = by_hash.get(hole.digest)
        if value is None or sealed[hole.at : hole.at + len(mark)] != mark:
            missing += 1
            continue
        parts.append(sealed[pos : hole.at])
        parts.append(value)
        pos = hole.at + len(mark)
    parts.append(sealed[pos:])
    return "".join(parts), missing


def _piece_of_length(
    values: Iterable[str], length: int, want: str, digest: Callable[[bytes], str]
) -> str | None:
    """The start or end, `length` characters long, of a form of `values` whose `digest`
    is `want`; None if none is."""
    for form in {f for v in values for f in forms(v)}:
        first, last = _LINE_BREAK.split(form, maxsplit=1)[0], _last_line(form)
        for piece in (first[:length], last[len(last) - length :]):
            if len(piece) == length and digest(_utf8(piece)) == want:
                return piece
    return None


# For a record sealed before holes kept their length: parts of forms longer than this are not
# offered back to its holes (their digests would cost quadratic time).
_REFILL_PART_FORM_CHARS = 4096


def _part_digests(values: Iterable[str], digest: Callable[[bytes], str]) -> dict[str, str]:
    """`digest` of every start and end of every form of `values` the redactor redacts alone."""
    out: dict[str, str] = {}
    for form in {f for v in values for f in forms(v)}:
        if len(form) > _REFILL_PART_FORM_CHARS:
            continue
        first, last = _LINE_BREAK.split(form, maxsplit=1)[0], _last_line(form)
        for k in range(part_length(form), len(form)):
            for piece in (
                first[:k] if k <= len(first) else "",
                last[len(last) - k :] if k <= len(last) else "",
            ):
                if piece:
                    out.setdefault(digest(_utf8(piece)), piece)
    return out


DEFAULT = Redactor()
