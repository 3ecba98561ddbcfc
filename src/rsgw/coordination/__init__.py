"""Several gateways, one placement: lpt_packing coordinated through etcd (issue 39).

`_etcd` is the etcd client (rsgw's own gRPC channel over etcd's v3 API); `_records`
what the gateways write in etcd (pure). The gateway's side, which drives its packing
shell, is `rsgw.gateway._coordinator`.
"""
