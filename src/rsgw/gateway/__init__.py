"""The gateway: one KServe V2 endpoint routing raw requests to N workers."""
