"""rsgw: one KServe V2 gRPC endpoint in front of many GPU inference workers.

The map. Each package says in its own `__init__` what it holds and what it may import;
tests/test_purity.py holds the layering below (every import counts, annotation-only
ones too). Read from the bottom up:

- `base/` the vocabulary every part shares: errors, status codes, methods, call
  context, values, limits. Imports nothing of rsgw.
- `http2/` rsgw's own HTTP/2 and HPACK, sans-IO. Imports nothing of rsgw.
- `runtime/` what a running rsgw process stands on: sockets, TLS, logs, metrics
  exposition, the admin HTTP server. Imports `base/`.
- `grpc/` gRPC: its sans-IO core (`grpc/protocol/`) and the server and client shells.
  Imports `base/`, `runtime/`, `http2/`.
- `scheduling/` the pure cores the gateway decides with: knobs, fleet, calls,
  placement. Imports `base/`.
- `config/` gateway.yml and the environment, checked into a frozen `GatewayConfig`.
  Imports `base/` and scheduling's knobs and fleet.
- `coordination/` several gateways, one placement, through etcd. Imports `grpc/` and
  scheduling's placement.
- `rest/` the KServe V2 REST door. Imports `base/`, `runtime/`, gRPC's protocol.
- `gateway/` the Trio shell of the gateway: its fleet, calls, placement and observe
  rooms, wired at its top. Imports everything above but `worker/`, `node/`, `ctl/`,
  `simulate/`.
- `worker/` the simulated GPU worker; `node/` the supervisor of a node's processes;
  `ctl/` `rsgw ctl`; `simulate/` `rsgw simulate`. Each imports what it runs on.
- `_proto/` generated protobuf code, with its own descriptor pool (anyone may import it).

At the top, besides this package face: `__main__` (`python -m rsgw`), `_version`,
`_cli` (the `rsgw` command: it runs the others) and `_flags` (its parser).
"""

from __future__ import annotations

from rsgw._version import __version__ as __version__
from rsgw.base._errors import ConfigError as ConfigError
from rsgw.base._errors import GatewayWedged as GatewayWedged
from rsgw.base._errors import ListenError as ListenError
from rsgw.base._errors import RsgwError as RsgwError
from rsgw.base._errors import StartupError as StartupError
from rsgw.config._config import GatewayConfig as GatewayConfig
from rsgw.config._config import load_config as load_config
from rsgw.gateway._gateway import open_gateway as open_gateway
from rsgw.gateway._gateway import serve_gateway as serve_gateway
from rsgw.gateway._running import GatewayStatus as GatewayStatus
from rsgw.gateway._running import RunningGateway as RunningGateway
from rsgw.node._probe import probe_worker_ready as probe_worker_ready

__all__ = [
    "ConfigError",
    "GatewayConfig",
    "GatewayStatus",
    "GatewayWedged",
    "ListenError",
    "RsgwError",
    "RunningGateway",
    "StartupError",
    "__version__",
    "load_config",
    "open_gateway",
    "probe_worker_ready",
    "serve_gateway",
]
