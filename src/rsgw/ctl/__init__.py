"""`rsgw ctl`: the operator front end of the gateway's GatewayControlService.

Imports `rsgw.base`, `rsgw.runtime`, `rsgw.grpc` (its channel) and
`rsgw.scheduling.knobs` (the knobs it may set). `tools/gateway_ctl.py` runs the same
`main`.

- `_commands` what to ask, as data and as requests (pure).
- `_args` the command line (pure).
- `_render` replies as text (pure).
- `_main` dials the gateway and prints.
"""

from __future__ import annotations

from rsgw.ctl._main import main as main

__all__ = ["main"]
