#!/usr/bin/env python3
"""`gateway_ctl`: the operator CLI of the gateway's scheduler, as a script.

The same program as `rsgw ctl` (docs/original.md §7 names the original's tool
`gateway_ctl`, and runbooks call it by that name); it needs rsgw installed:

    python tools/gateway_ctl.py [--gateway HOST:PORT] status
"""

from __future__ import annotations

import sys

from rsgw.ctl import main

if __name__ == "__main__":
    sys.exit(main(prog="gateway_ctl"))
