"""Triton's `simple` as an MLServer model (runs inside MLServer's own environment).

INPUT0 and INPUT1 (INT32) in, OUTPUT0 = their sum and OUTPUT1 = their difference
out, as Triton's example model computes them, so stock Triton clients can check the
answers. docs/tutorial.md serves it as two models, `simple` and `twin`, from two
MLServer workers behind rsgw; tests/thirdparty uses this file too.
"""

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class SimpleModel(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        tensors = {t.name: NumpyCodec.decode_input(t) for t in payload.inputs}
        a, b = tensors["INPUT0"], tensors["INPUT1"]
        return InferenceResponse(
            model_name=self.name,
            id=payload.id,
            outputs=[
                NumpyCodec.encode_output("OUTPUT0", a + b),
                NumpyCodec.encode_output("OUTPUT1", a - b),
            ],
        )
