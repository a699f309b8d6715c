"""The redactor's cost on 1 MiB of output, and how often registered values' parts are found
in ordinary text (false positives). Prints a table; writes bench/results/redact.json.

    .venv/bin/python bench/redact.py [--repeat 15]

Workloads (1 MiB each): the standard library's source as ordinary output, without and with
registered values (none of them in it); the same text with 2,000 pieces of a value (starts
and ends of it, cut without a mark) mixed in; a value repeated whole, and its 27-character
start repeated (hostile texts: one match every 53 or 28 characters). Each is timed through
`Redactor.redact` (a result) and `LiveRedactor` fed in 4 KiB writes (a stream). False positives: spans that the registered values' parts find in 8 MiB of
the standard library's source, for values shaped like real ones (random tokens, a URL with a
token, a DSN, word-like passwords).
"""

from __future__ import annotations

import argparse
import random
import string
import sysconfig
import time
from pathlib import Path

from latency import save_results

from execbox.redact import DEFAULT, Redactor
from execbox.redact.live import LiveRedactor

MIB = 1 << 20


def corpus(size: int) -> str:
    """`size` characters of the standard library's Python source, in a fixed order."""
    parts: list[str] = []
    total = 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        parts.append(text)
        total += len(text)
        if total >= size:
            break
    return "".join(parts)[:size]


def token(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(n))


def best_ms(fn: object, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append((time.perf_counter() - t) * 1000)
    return round(min(times), 2)


def live(redactor: Redactor, data: bytes) -> None:
    out: list[bytes] = []
    stream = LiveRedactor(redactor, out.append)
    for i in range(0, len(data), 4096):
        stream.write(data[i : i + 4096])
    stream.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    rng = random.Random(7)
    text = corpus(MIB)
    values = [
        "sk-" + token(rng, 48),
        "hunter2-" + token(rng, 44),
        token(rng, 16),
        "ghp_" + token(rng, 36),
    ]
    with_secrets = DEFAULT.with_secrets(values)
    value = values[1]
    lines = text.split("\n")
    for i in range(2000):  # starts and ends of a value, 20 to 40 of its 52 characters
        k = rng.randint(20, 40)
        piece = value[:k] if i % 2 else value[-k:]
        at = rng.randrange(len(lines))
        lines[at] = lines[at] + " " + piece
    pieces = "\n".join(lines)[:MIB]
    hostile = (value[:27] + " ") * (MIB // 28)
    whole = (value + " ") * (MIB // 53)
    workloads = {
        "ordinary, no values": (DEFAULT, text),
        "ordinary, 4 values": (with_secrets, text),
        "2,000 pieces, 4 values": (with_secrets, pieces),
        "whole values, 4 values": (with_secrets, whole),
        "starts of values, 4 values": (with_secrets, hostile),
    }
    result: dict[str, object] = {}
    print(f"{'1 MiB of output':<28}{'redact ms':>11}{'live ms':>10}{'redactions':>12}")
    for name, (redactor, sample) in workloads.items():
        data = sample.encode()
        row = {
            "redact_ms": best_ms(lambda r=redactor, s=sample: r.redact(s), args.repeat),
            "live_ms": best_ms(lambda r=redactor, d=data: live(r, d), args.repeat),
            "redactions": len(redactor.findings(sample)),
        }
        result[name] = row
        print(f"{name:<28}{row['redact_ms']:>11.2f}{row['live_ms']:>10.2f}{row['redactions']:>12}")
    big = corpus(8 * MIB)
    shaped = {
        "random tokens": values,
        "URL with a token": ["https://hooks.example.com/services/" + token(rng, 24)],
        "DSN": ["postgresql://app:" + token(rng, 12) + "@db.internal:5432/prod"],
        "word-like passwords": [
            "password-2024!",
            "correct-horse-battery",
            "Summer2024!",
            "letmein-admin",
        ],
    }
    false_positives: dict[str, dict[str, object]] = {}
    print(f"\n{'values (8 MiB of stdlib)':<28}{'spans':>8}  examples")
    for name, vals in shaped.items():
        redactor = Redactor(vals, patterns=False)
        found = redactor.findings(big)
        examples = sorted({big[f.start : f.end] for f in found})[:4]
        false_positives[name] = {"spans": len(found), "examples": examples}
        print(f"{name:<28}{len(found):>8}  {examples}")
    result["false_positives_8MiB"] = false_positives
    save_results("redact", result)


if __name__ == "__main__":
    main()
