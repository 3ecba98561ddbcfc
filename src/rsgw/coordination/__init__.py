"""Several gateways, one placement: lpt_packing coordinated through etcd (issue 39).

Imports `rsgw.base`, `rsgw.runtime`, `rsgw.grpc` and `rsgw.scheduling.placement`.
The gateway's side, which drives its packing shell, is
`rsgw.gateway.placement._coordinator`.

- `_etcd` the etcd client: rsgw's own gRPC channel over etcd's v3 API.
- `_records` what the gateways write in etcd (pure).
"""
