"""The simulated GPU worker: a KServe V2 server whose device is a cost model."""
