"""A KServe ModelServer serving Triton's `simple` under the names in $MODELS.

Runs inside KServe's own environment (tests/thirdparty/servers.py starts it with
`--grpc_port`, `--http_port` and `--workers 1`, which KServe's own argument parser
reads). OUTPUT0 = INPUT0 + INPUT1 and OUTPUT1 = INPUT0 - INPUT1, as Triton's example.
"""

import os

from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer


class Simple(Model):  # type: ignore[misc]  # KServe's base, untyped here
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.load()

    def load(self) -> bool:
        self.ready = True
        return True

    async def predict(
        self,
        payload: InferRequest,
        headers: dict[str, str] | None = None,
        response_headers: dict[str, str] | None = None,
    ) -> InferResponse:
        tensors = {t.name: t.as_numpy() for t in payload.inputs}
        a, b = tensors["INPUT0"], tensors["INPUT1"]
        outputs = []
        for name, value in (("OUTPUT0", a + b), ("OUTPUT1", a - b)):
            output = InferOutput(name, list(value.shape), "INT32")
            output.set_data_from_numpy(value)
            outputs.append(output)
        return InferResponse(model_name=self.name, infer_outputs=outputs, response_id=payload.id)


if __name__ == "__main__":
    ModelServer().start([Simple(name) for name in os.environ["MODELS"].split(",")])
