"""The ops: `xrt.ops.matmul(a, b)` and friends. Each module holds one op's schema, float64 reference and
front-end function; kernels live in the backends. The registry finds every module's OpSchema objects."""

from .add_norm import add_layer_norm, add_rms_norm
from .add_norm_backward import add_layer_norm_backward, add_rms_norm_backward
from .attention import attention
from .attention_backward import attention_backward
from .attention_forward import attention_forward
from .autocast_linear import autocast_linear
from .elementwise import sin_affine
from .fused_elementwise import fused_elementwise
from .glu import geglu, swiglu
from .glu_backward import geglu_backward, swiglu_backward
from .linear import linear
from .linear_backward import linear_grad_input, linear_grad_weight, split_weight_grad
from .linear_cross_entropy import linear_cross_entropy, linear_cross_entropy_forward
from .linear_cross_entropy_backward import linear_cross_entropy_backward
from .matmul import matmul
from .norm import layer_norm, rms_norm
from .norm_backward import layer_norm_backward, rms_norm_backward
from .reduction import sum
from .rotary import rotary_embedding
from .rotary_backward import rotary_embedding_backward
from .softmax import softmax

__all__ = [
    "add_layer_norm", "add_layer_norm_backward", "add_rms_norm", "add_rms_norm_backward", "attention",
    "attention_backward", "attention_forward", "autocast_linear", "fused_elementwise", "geglu", "geglu_backward",
    "layer_norm", "layer_norm_backward", "linear", "linear_cross_entropy", "linear_cross_entropy_backward",
    "linear_cross_entropy_forward", "linear_grad_input", "linear_grad_weight", "matmul", "rms_norm",
    "rms_norm_backward", "rotary_embedding", "rotary_embedding_backward", "sin_affine", "softmax",
    "split_weight_grad", "sum", "swiglu", "swiglu_backward",
]  # fmt: skip
