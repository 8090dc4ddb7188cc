"""Mixed precision as Keras' ``keras.mixed_precision``: a layer's dtype policy names the dtype of its
weights (``variable_dtype``) and of its products (``compute_dtype``).

attnx knows three policies:

- ``"float32"`` and ``"float64"``: weights and computations in that dtype (float64 is for gradient checks);
- ``"mixed_bfloat16"``: float32 weights, optimizer state, losses and everything elementwise (softmax,
  norms, masks, gate nonlinearities, reductions, the bias gradient); the matrix products of the layers
  that implement it on bfloat16 operands with float32 sums, forward and backward
  (``cpp/include/attnx/bf16.hpp``: ``vdpbf16ps`` on CPUs with AVX512_BF16, the same arithmetic on
  float lanes elsewhere). Which layers implement it: ``Layer._bf16_products``; the others compute in
  float32 under the policy, and their ``compute_dtype`` says so.

Set it for every layer made from now on, or per layer, as in Keras::

    attnx.mixed_precision.set_global_policy("mixed_bfloat16")
    layers.Dense(256, dtype="mixed_bfloat16")

A layer's config records its policy's name under ``"dtype"``, so saved models keep it. bfloat16
keeps float32's exponent range: no loss scaling is needed (Keras' ``LossScaleOptimizer`` is for
float16, which attnx does not have).
"""
from . import backend

__all__ = ["Policy", "DTypePolicy", "global_policy", "set_global_policy"]

POLICY_NAMES = ("float32", "float64", "mixed_bfloat16")


class Policy:
    """A dtype policy: ``Policy("mixed_bfloat16")`` (Keras' ``DTypePolicy``)."""

    def __init__(self, name):
        if isinstance(name, Policy):
            name = name.name
        if not isinstance(name, str) or name not in POLICY_NAMES:
            hint = ("; attnx has no float16 kernels: mixed_bfloat16 gives the same savings with float32's range"
                    if name in ("float16", "mixed_float16", "bfloat16") else "")
            raise ValueError(f"Policy: expected one of {', '.join(POLICY_NAMES)}, got {name!r}{hint}")
        self.name = name

    @property
    def variable_dtype(self):
        """The dtype of the weights: float32 under mixed_bfloat16."""
        return "float32" if self.name == "mixed_bfloat16" else self.name

    @property
    def compute_dtype(self):
        """The dtype of the products of the layers that implement the policy."""
        return "bfloat16" if self.name == "mixed_bfloat16" else self.name

    def get_config(self):
        return {"name": self.name}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __eq__(self, other):
        return isinstance(other, Policy) and other.name == self.name

    def __hash__(self):
        return hash(self.name)

    def __repr__(self):
        return f'<Policy "{self.name}">'


DTypePolicy = Policy  # Keras 3's name

_global_policy = None  # None: attnx.backend.floatx()


def global_policy():
    """The policy of layers made without a ``dtype``: the one set, else ``attnx.backend.floatx()``'s."""
    return Policy(_global_policy or backend.floatx())


def set_global_policy(policy):
    """Makes `policy` ("float32", "float64", "mixed_bfloat16" or a `Policy`) the one of the layers made
    from now on without a ``dtype``; None returns to ``attnx.backend.floatx()``."""
    global _global_policy
    _global_policy = None if policy is None else Policy(policy).name


def layer_policy(dtype, where):
    """The policy a layer's ``dtype`` argument names: None is the global policy; a float dtype must be
    float32 or float64 (TypeError naming `where` otherwise)."""
    if dtype is None:
        return global_policy()
    if isinstance(dtype, Policy) or (isinstance(dtype, str) and dtype == "mixed_bfloat16"):
        return Policy(dtype)
    return Policy(backend.as_float_dtype(dtype, where).name)
