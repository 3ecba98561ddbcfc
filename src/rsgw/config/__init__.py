"""gateway.yml and the `REACTANT_GATEWAY_*` (and `OTEL_*`) environment, checked into
`GatewayConfig`.

Pure. Imports `rsgw.base` and the scheduling knobs, fleet and calls cores
(`rsgw.scheduling.knobs`, `rsgw.scheduling.fleet`, `rsgw.scheduling.calls`), whose
settings it checks. The
gateway, the node and the simulator import it.

- `_config` the file and the environment -> `GatewayConfig` (`load_config`).
- `_schema` `GatewayConfig`: the frozen object the gateway reads.
- `_blocks` the small blocks: listen, TLS, auth, limits, logging, connections, ...
- `_fleet_blocks` the fleet's blocks: discovery, coordination, repository.
- `_tracing` the tracing block, set by OpenTelemetry's own `OTEL_*` variables.
- `_tenancy` the tenants' block: priorities, fair-share weights, quotas.
- `_endpoints` the worker lists, each entry checked, and the walk that pairs them.
"""
