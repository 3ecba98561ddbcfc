"""rsgw: one KServe V2 gRPC endpoint in front of many GPU inference workers."""

from __future__ import annotations

from rsgw._config import GatewayConfig as GatewayConfig
from rsgw._config import load_config as load_config
from rsgw._errors import ConfigError as ConfigError
from rsgw._errors import GatewayWedged as GatewayWedged
from rsgw._errors import ListenError as ListenError
from rsgw._errors import RsgwError as RsgwError
from rsgw._errors import StartupError as StartupError
from rsgw._version import __version__ as __version__
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
