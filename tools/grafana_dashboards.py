#!/usr/bin/env python3
"""Write rsgw's Grafana dashboards (`grafana/dashboards/*.json`) from `tools/dashboards/`.

The JSON is committed, so Grafana provisioning and a reader of the repository need no
Python; `tools/dashboards/` is the shorter, reviewable source of it, written with Grafana's
own typed builders (the `grafana-foundation-sdk` package, in the `test` extra), so the JSON
follows Grafana's dashboard schema. `--check` fails (exit 1) when the committed JSON
differs from what the definitions make, as `tools/regen_protos.py --check` does for the
protos; CI runs it. docs/operations.md says which panel answers which question.

    python tools/grafana_dashboards.py           # rewrite both copies
    python tools/grafana_dashboards.py --check   # are they current?

It writes (and checks) the Kubernetes base's copy, deploy/kubernetes/base/dashboards/,
too: a ConfigMap generator cannot reach outside its directory, so the JSON is there
twice, and a change made to one copy only was once missed until CI.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dashboards import DASHBOARDS
from grafana_foundation_sdk.cog.encoder import JSONEncoder

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "grafana" / "dashboards"
#: The Kubernetes base's copy (docs/deploy.md).
COPIES = (OUT, ROOT / "deploy" / "kubernetes" / "base" / "dashboards")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the JSON is stale")
    args = parser.parse_args()
    stale = []
    for name, build in DASHBOARDS.items():
        text = json.dumps(build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"
        for folder in COPIES:
            path = folder / name
            if args.check:
                if not path.exists() or path.read_text() != text:
                    stale.append(str(path.relative_to(ROOT)))
            else:
                folder.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    if stale:
        print(
            f"stale dashboards: {', '.join(stale)}; run python tools/grafana_dashboards.py",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
