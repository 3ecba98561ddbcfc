"""`rsgw ctl`: the operator front end of the gateway's GatewayControlService.

`_commands` (what to ask, as data and as requests), `_args` (the command line) and
`_render` (replies as text) are pure; `_main` dials the gateway and prints.
`tools/gateway_ctl.py` runs the same `main`.
"""

from __future__ import annotations

from rsgw.ctl._main import main as main

__all__ = ["main"]
