"""The known formats of secrets: a table of regular expressions, each naming its kind.

AWS access key ids and (in context) secret keys, OpenAI and Anthropic keys, GitHub tokens, Slack
tokens and webhook URLs, JWTs, PEM private key blocks, Authorization / API-key headers, bearer
tokens, passwords in URLs, secret query parameters, Google API keys, Stripe keys.

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

import re
from dataclasses import dataclass

__all__ = [
    "REGISTERED",
    "RULES",
    "PLACEHOLDER",
    "SCREEN_MAX",
    "Rule",
    "lower_same_length",
    "screen",
]

REGISTERED = "secret"  # the kind of a registered value


@dataclass(frozen=True, slots=True)
class Rule:
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


def _rule(kind: str, regex: str, *, lowered: bool = False) -> Rule:
    pattern = re.compile(regex, re.VERBOSE)
    groups = tuple(sorted(pattern.groupindex, key=pattern.groupindex.__getitem__))
    return Rule(kind, pattern, lowered, groups, _min_width(regex, re.VERBOSE))


def _min_width(regex: str, flags: int) -> int:
    """The fewest characters a match of `regex` spans, from the regex parser `re` itself
    uses (lookarounds count as none); 0, so the rule is always run, where it cannot tell."""
    try:
        from re import _parser  # type: ignore[attr-defined, unused-ignore]  # CPython 3.11+; typeshed omits it

        return max(0, int(_parser.parse(regex, flags).getwidth()[0]))
    except Exception:  # noqa: BLE001 - another implementation: no shortcut, same result
        return 0


def _keyword(kind: str, lead: str, tails: str, value: str) -> Rule:
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

RULES: tuple[Rule, ...] = (
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

KINDS = tuple(dict.fromkeys([*(r.kind for r in RULES), REGISTERED]))

# Texts up to SCREEN_MAX characters are first searched with one expression per subject (the
# text, its lowercased copy) that matches wherever any rule of that subject does: most short
# texts (a run's code, its output) hold no secret, and then one search replaces a scan per
# rule. Past it, the rules' own literal-led scans are the faster way.
SCREEN_MAX = 512
_NAMED_GROUP = re.compile(r"\(\?P<\w+>")


def _any_of(rules: list[Rule]) -> re.Pattern[str]:
    """One expression matching where any of `rules` matches: their alternation, each rule's
    named groups made plain (rules share group names; none refers back to a group)."""
    sources = []
    for rule in rules:
        source = rule.pattern.pattern
        if "(?P=" in source or re.search(r"(?<!\\)\\[1-9]", source):
            raise ValueError(f"rule {rule.kind!r} refers back to a group: it cannot be screened")
        # A newline ends a trailing verbose-mode comment before the group closes.
        sources.append(f"(?:{_NAMED_GROUP.sub('(?:', source)}\n)")
    return re.compile("|".join(sources), re.VERBOSE)


SHORTEST = min(rule.min_len for rule in RULES)  # no rule matches a shorter text
_SCREEN_TEXT = _any_of([r for r in RULES if not r.lowered])
_SCREEN_LOWERED = _any_of([r for r in RULES if r.lowered])


def screen(text: str, lowered: str) -> bool:
    """Whether any rule may match `text` (`lowered`: its `lower_same_length`); False means
    none does. For texts of at most SCREEN_MAX characters."""
    return bool(_SCREEN_TEXT.search(text) or _SCREEN_LOWERED.search(lowered))


# Placeholders already in the text are never redacted again (that is what makes redaction
# idempotent). Only the exact marks this module writes count, so a program cannot shield a
# secret by printing "[REDACTED:" in front of it.
PLACEHOLDER = re.compile(r"\[REDACTED:(?:" + "|".join(KINDS) + r")\]")


def lower_same_length(text: str) -> str:
    """`text.lower()` with the same length, so spans found in it are spans of `text`.

    U+0130 (dotted capital I) is the only code point whose lowercase is two characters.
    """
    lowered = text.lower()
    if len(lowered) != len(text):
        lowered = text.replace("\u0130", "i").lower()
    return lowered
