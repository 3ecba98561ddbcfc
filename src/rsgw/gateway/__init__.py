"""The gateway: one KServe V2 endpoint routing raw requests to N workers.

The Trio shell around the pure cores of `rsgw.scheduling`, in four rooms and the
wiring that builds them. A room imports the rooms listed before it, never one after:

- `observe/` what the gateway says about itself: metrics, the access log, log settings.
- `fleet/` the workers it watches: a channel each, probes, model discovery, DNS
  targets, capabilities, routing metadata, the stall watchdog.
- `calls/` the path of one call, for whichever door serves it: the handler table,
  ModelInfer, streaming, admission, the guard, fan-outs, shared memory, model control.
- `placement/` lpt_packing's shell: startup checks, the repack loop, the repository
  placer, coordination with other gateways, the scheduling status.

The wiring, here, may import every room, and `rsgw.rest` for its second door:

- `_gateway` `serve_gateway` and `open_gateway`: the nursery tree, started in order.
- `_parts` the builders of the parts, each given what it needs when it is built.
- `_doors` the admin HTTP server, the gRPC listener and the REST listener.
- `_members` workers joining and leaving a running gateway.
- `_control` GatewayControlService: membership and scheduling changes from an operator.
- `_admin_routes` `/metrics` for the whole node, `/healthz`, `/readyz`.
- `_running` `RunningGateway`: status, reload, graceful stop.
"""
