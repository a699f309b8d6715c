"""Secrets split across two writes, for the live-output tests of every face.

`program()` writes each sample split at every byte offset across two flushed writes, with a
pause between them so that the host reads them as two chunks (a split inside a UTF-8 sequence
included), then a line end. Every face must show none of `SECRETS`."""

from __future__ import annotations

import base64
import json
import uuid

from tests.test_redact import CASES

# Registered values: ASCII, non-ASCII (split inside its UTF-8 sequences) and one with a line
# break (a line end is where live output is released).
REGISTERED = (
    "s3cr3t-" + uuid.uuid4().hex[:12],
    "pässwörd-€-" + uuid.uuid4().hex[:8],
    "two-line\nsecret-" + uuid.uuid4().hex[:8],
)
SAMPLES = tuple(c.text for c in CASES) + REGISTERED
SECRETS = tuple(c.secret for c in CASES) + REGISTERED
OUTPUT_BYTES = 8 << 20  # every sample at every offset: about 1 MiB


def program(*streams: str, pause_s: float = 0.001) -> str:
    """The code that writes every sample split at every offset to each of `streams`."""
    data = json.dumps([base64.b64encode(s.encode()).decode() for s in SAMPLES])
    return (
        "import base64, sys, time\n"
        f"for out in [{', '.join(f'sys.{s}.buffer' for s in streams or ('stdout',))}]:\n"
        f"    for sample in {data}:\n"
        "        b = base64.b64decode(sample)\n"
        "        for k in range(1, len(b)):\n"
        "            out.write(b[:k]); out.flush()\n"
        f"            time.sleep({pause_s})\n"
        "            out.write(b[k:] + b'\\n'); out.flush()\n"
    )


def leaked(text: str) -> list[str]:
    """The secrets that appear in `text` (each shown by its first characters)."""
    return [s[:12] + "..." for s in SECRETS if s in text]
