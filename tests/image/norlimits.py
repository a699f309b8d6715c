"""Drop the rlimits from an OCI bundle's config.json or an exec's process.json (see
tests/image/run)."""

import json
import sys

path = sys.argv[1]
with open(path) as fh:
    config = json.load(fh)
config.get("process", config).pop("rlimits", None)
with open(path, "w") as fh:
    json.dump(config, fh)
