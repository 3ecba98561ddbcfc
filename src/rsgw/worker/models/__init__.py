"""What a simulated model is and computes: specs, the catalogue, tensors.

Pure. Imports `rsgw.base`. The device, the worker's server and the simulator use it.

- `_specs` one model's spec, and the catalogue of them.
- `_catalogue` the `models:` document, and where one comes from.
- `_entries` one catalogue entry, parsed.
- `_compute_kinds` the compute kinds an entry may name, and their tensors.
- `_compute` what a model computes: real results for the Triton examples, zeros else.
- `_tensors` tensors as the worker holds them: datatype, wire shape, raw bytes.
- `_classification` Triton's classification extension.
"""
