"""The ops: `xrt.ops.matmul(a, b)` and friends. Each module holds one op's schema, float64 reference and
front-end function; kernels live in the backends."""

from .attention import ATTENTION, attention
from .elementwise import SIN_AFFINE, sin_affine
from .matmul import MATMUL, matmul
from .norm import LAYER_NORM, RMS_NORM, layer_norm, rms_norm
from .reduction import SUM, sum
from .softmax import SOFTMAX, softmax

SCHEMAS = (SIN_AFFINE, SUM, MATMUL, SOFTMAX, LAYER_NORM, RMS_NORM, ATTENTION)

__all__ = ["SCHEMAS", "attention", "layer_norm", "matmul", "rms_norm", "sin_affine", "softmax", "sum"]
