"""Build a tiny TFLite image classifier without TensorFlow, byte for byte reproducibly.

The tests need a real ``.tflite`` file that is small enough to commit, whose every weight
is known, and that can be rebuilt from source. No converter is needed: a TFLite model is
a FlatBuffer, and ai-edge-litert ships the generated schema module
(``ai_edge_litert.schema_py_generated``). This script fills in that schema's object API
(``ModelT`` -> ``SubGraphT`` -> ``TensorT`` / ``OperatorT`` / ``OperatorCodeT`` /
``BufferT``), packs it with ``flatbuffers.Builder`` and finishes it with the file
identifier ``TFL3``.

The network, all float32 and NHWC::

    image [1,16,16,3] -> CONV_2D 3x3, 8 filters, SAME, stride 1, fused ReLU -> [1,16,16,8]
                      -> MEAN over H and W                                  -> [1,8]
                      -> FULLY_CONNECTED 8 -> 4                             -> [1,4]
                      -> SOFTMAX                                            -> scores [1,4]

The ``_uint8`` variant takes the image as uint8 [1,16,16,3] (what a camera gives) and
starts with DEQUANTIZE (scale 1/255, zero point 0) into the same network.

Weights come from ``numpy.random.default_rng(SEED)`` through :func:`make_weights`, which
the tests import to compute the same network in NumPy. Constant buffers are written
16-byte aligned, as the TFLite converter does, so kernels may read them in place on any
CPU. Running the script twice gives identical files.

Usage::

    python scripts/make_tiny_tflite.py                  # tests/data/tiny_classifier.tflite
    python scripts/make_tiny_tflite.py --out /tmp/m.tflite   # and /tmp/m_uint8.tflite
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import flatbuffers
import numpy as np
import numpy.typing as npt
from ai_edge_litert import schema_py_generated as tfl

SEED = 20240611
INPUT_SHAPE = (1, 16, 16, 3)
FILTERS = 8
CLASSES = 4
UINT8_SCALE = 1.0 / 255.0
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "tiny_classifier.tflite"

Weights = dict[str, npt.NDArray[np.float32]]


def make_weights(seed: int = SEED) -> Weights:
    """The network's constants: conv filter in TFLite's OHWI layout, FC weights [out, in]."""
    rng = np.random.default_rng(seed)
    return {
        "conv/filter": rng.normal(0.0, 0.5, (FILTERS, 3, 3, 3)).astype(np.float32),
        "conv/bias": rng.normal(0.0, 0.1, (FILTERS,)).astype(np.float32),
        "fc/weights": rng.normal(0.0, 1.0, (CLASSES, FILTERS)).astype(np.float32),
        "fc/bias": rng.normal(0.0, 0.1, (CLASSES,)).astype(np.float32),
    }


class _AlignedBufferT(tfl.BufferT):  # type: ignore[misc]
    """A ``BufferT`` whose bytes start on a 16-byte boundary (the schema's force_align).

    The generated ``BufferT.Pack`` aligns data only to its element size (1 byte), which
    would leave float weights misaligned in the file.
    """

    def Pack(self, builder: flatbuffers.Builder) -> int:  # noqa: N802 - schema's name
        data = None
        if self.data is not None:
            raw = bytes(self.data)
            builder.StartVector(1, len(raw), 16)
            builder.head -= len(raw)
            builder.Bytes[builder.head : builder.head + len(raw)] = raw
            data = builder.EndVector()
        tfl.BufferStart(builder)
        if data is not None:
            tfl.BufferAddData(builder, data)
        end: int = tfl.BufferEnd(builder)
        return end


class _GraphBuilder:
    """Collects tensors, buffers, operator codes and operators of one subgraph."""

    def __init__(self, dynamic_batch: bool = False) -> None:
        self.dynamic_batch = dynamic_batch
        self.buffers: list[tfl.BufferT] = [_AlignedBufferT()]  # buffer 0: the empty sentinel
        self.tensors: list[tfl.TensorT] = []
        self.opcodes: list[int] = []
        self.operators: list[tfl.OperatorT] = []

    def tensor(
        self,
        name: str,
        shape: tuple[int, ...],
        ttype: int = tfl.TensorType.FLOAT32,
        data: npt.NDArray[np.generic] | None = None,
        quantization: tfl.QuantizationParametersT | None = None,
    ) -> int:
        t = tfl.TensorT()
        t.name = name
        t.shape = list(shape)
        t.type = ttype
        t.quantization = quantization
        if data is not None:
            buf = _AlignedBufferT()
            # Little-endian whatever the host, so the file is the same everywhere.
            buf.data = data.astype(data.dtype.newbyteorder("<")).tobytes()
            self.buffers.append(buf)
            t.buffer = len(self.buffers) - 1
        elif self.dynamic_batch:  # every activation here is batch-first
            t.shapeSignature = [-1, *shape[1:]]
        self.tensors.append(t)
        return len(self.tensors) - 1

    def op(
        self,
        code: int,
        inputs: list[int],
        outputs: list[int],
        options_type: int = tfl.BuiltinOptions.NONE,
        options: object = None,
    ) -> None:
        if code not in self.opcodes:
            self.opcodes.append(code)
        o = tfl.OperatorT()
        o.opcodeIndex = self.opcodes.index(code)
        o.inputs = inputs
        o.outputs = outputs
        o.builtinOptionsType = options_type
        o.builtinOptions = options
        self.operators.append(o)

    def model(self, inputs: list[int], outputs: list[int], description: str) -> bytes:
        sub = tfl.SubGraphT()
        sub.tensors = self.tensors
        sub.inputs = inputs
        sub.outputs = outputs
        sub.operators = self.operators
        sub.name = "main"
        codes = []
        for code in self.opcodes:
            c = tfl.OperatorCodeT()
            c.builtinCode = code
            c.deprecatedBuiltinCode = min(code, 127)  # the int8 field old readers use
            c.version = 1
            codes.append(c)
        m = tfl.ModelT()
        m.version = 3
        m.description = description
        m.operatorCodes = codes
        m.subgraphs = [sub]
        m.buffers = self.buffers
        builder = flatbuffers.Builder(4096)
        builder.Finish(m.Pack(builder), file_identifier=b"TFL3")
        return bytes(builder.Output())


def build_model(weights: Weights, uint8_input: bool = False, dynamic_batch: bool = False) -> bytes:
    """Serialise the classifier (see the module docstring) into TFLite FlatBuffer bytes.

    ``dynamic_batch`` declares the batch dimension as -1 in the shape signatures (the
    allocated shape stays 1), for testing how a backend resizes inputs.
    """
    g = _GraphBuilder(dynamic_batch)
    if uint8_input:
        q = tfl.QuantizationParametersT()
        q.scale = [UINT8_SCALE]
        q.zeroPoint = [0]
        image = g.tensor("image", INPUT_SHAPE, tfl.TensorType.UINT8, quantization=q)
        x = g.tensor("image_float", INPUT_SHAPE)
        g.op(tfl.BuiltinOperator.DEQUANTIZE, [image], [x])
    else:
        image = x = g.tensor("image", INPUT_SHAPE)

    conv_w = g.tensor("conv/filter", (FILTERS, 3, 3, 3), data=weights["conv/filter"])
    conv_b = g.tensor("conv/bias", (FILTERS,), data=weights["conv/bias"])
    conv = g.tensor("conv/relu", (*INPUT_SHAPE[:3], FILTERS))
    conv_opts = tfl.Conv2DOptionsT()
    conv_opts.padding = tfl.Padding.SAME
    conv_opts.strideH = conv_opts.strideW = 1
    conv_opts.fusedActivationFunction = tfl.ActivationFunctionType.RELU
    g.op(
        tfl.BuiltinOperator.CONV_2D,
        [x, conv_w, conv_b],
        [conv],
        tfl.BuiltinOptions.Conv2DOptions,
        conv_opts,
    )

    axes = g.tensor("pool/axes", (2,), tfl.TensorType.INT32, data=np.array([1, 2], np.int32))
    pooled = g.tensor("pool/mean", (1, FILTERS))
    g.op(
        tfl.BuiltinOperator.MEAN,
        [conv, axes],
        [pooled],
        tfl.BuiltinOptions.ReducerOptions,
        tfl.ReducerOptionsT(keepDims=False),
    )

    fc_w = g.tensor("fc/weights", (CLASSES, FILTERS), data=weights["fc/weights"])
    fc_b = g.tensor("fc/bias", (CLASSES,), data=weights["fc/bias"])
    logits = g.tensor("fc/logits", (1, CLASSES))
    g.op(
        tfl.BuiltinOperator.FULLY_CONNECTED,
        [pooled, fc_w, fc_b],
        [logits],
        tfl.BuiltinOptions.FullyConnectedOptions,
        tfl.FullyConnectedOptionsT(),
    )

    scores = g.tensor("scores", (1, CLASSES))
    g.op(
        tfl.BuiltinOperator.SOFTMAX,
        [logits],
        [scores],
        tfl.BuiltinOptions.SoftmaxOptions,
        tfl.SoftmaxOptionsT(beta=1.0),
    )
    kind = "uint8" if uint8_input else "float32"
    return g.model([image], [scores], f"edgefleet tiny classifier ({kind} input)")


def uint8_path(out: Path) -> Path:
    """Where the uint8-input variant goes: next to ``out``, with ``_uint8`` in its name."""
    return out.with_name(f"{out.stem}_uint8{out.suffix}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[0] if __doc__ else None,
        epilog="example: python scripts/make_tiny_tflite.py --out /tmp/tiny.tflite",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="float32 model path; the uint8 variant is written beside it (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    weights = make_weights()
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    for path, uint8_input in ((out, False), (uint8_path(out), True)):
        content = build_model(weights, uint8_input=uint8_input)
        path.write_bytes(content)
        print(f"{hashlib.sha256(content).hexdigest()}  {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
