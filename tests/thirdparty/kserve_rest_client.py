"""KServe's own REST client (kserve.InferenceRESTClient, protocol v2) against a URL.

Run by tests/thirdparty/test_kserve_rest_client.py in KServe's virtual environment
(its pins clash with rsgw's): `python kserve_rest_client.py http://host:port`. Checks
liveness, readiness, a model's readiness, and `simple` with JSON and with binary
tensors; prints one line per check and exits non-zero on the first failure.
"""

from __future__ import annotations

import asyncio
import sys

import numpy as np
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig


async def main(base_url: str) -> None:
    client = InferenceRESTClient(RESTConfig(protocol="v2"))
    assert await client.is_server_live(base_url), "not live"
    print("live")
    assert await client.is_server_ready(base_url), "not ready"
    print("ready")
    assert await client.is_model_ready(base_url, "simple"), "simple not ready"
    print("model ready")
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    for binary in (False, True):
        inputs = [InferInput("INPUT0", [1, 16], "INT32"), InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(a, binary_data=binary)
        inputs[1].set_data_from_numpy(b, binary_data=binary)
        request = InferRequest(model_name="simple", infer_inputs=inputs)
        response = await client.infer(base_url, request, model_name="simple")
        outputs = {o.name: o.as_numpy() for o in response.outputs}
        np.testing.assert_array_equal(outputs["OUTPUT0"].reshape(1, 16), a + b)
        np.testing.assert_array_equal(outputs["OUTPUT1"].reshape(1, 16), a - b)
        print(f"infer binary={binary}")
    await client.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
