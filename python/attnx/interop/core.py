"""PyTorch converters of the core layers: Linear <-> Dense, Embedding <-> Embedding."""
from ..layers.core import Dense, Embedding
from .registry import register_from_torch, register_to_torch, set_torch_params


@register_from_torch("Linear")
def _linear_from(module, dtype):
    layer = Dense(module.out_features, use_bias=module.bias is not None, dtype=dtype)
    layer.build((None, module.in_features))
    layer.built = True

    def to_attnx(t, grads=False):
        out = {"kernel": t["weight"].T}
        if "bias" in t:
            out["bias"] = t["bias"]
        return out
    return layer, to_attnx


@register_to_torch(Dense)
def _linear_to(layer):
    import torch
    if layer.activation != "linear":
        raise ValueError(f"to_torch: Dense '{layer.name}' has activation {layer.activation!r}; "
                         "torch.nn.Linear has none")
    kernel = layer.params["kernel"]
    module = torch.nn.Linear(kernel.shape[0], kernel.shape[1], bias=layer.use_bias,
                             dtype=getattr(torch, layer.dtype.name))
    tensors = {"weight": kernel.T}
    if layer.use_bias:
        tensors["bias"] = layer.params["bias"]
    return set_torch_params(module, tensors)


@register_from_torch("Embedding")
def _embedding_from(module, dtype):
    # these change the results (max_norm renormalizes rows inside forward, scale_grad_by_freq
    # rescales gradients); attnx's Embedding has neither. (padding_idx only freezes one row's
    # gradient in torch: the forward pass is the same.)
    if module.max_norm is not None or module.scale_grad_by_freq:
        raise ValueError("from_torch: torch.nn.Embedding with max_norm or scale_grad_by_freq has no attnx "
                         "equivalent")
    layer = Embedding(module.num_embeddings, module.embedding_dim, dtype=dtype)
    layer.build((None, None))
    layer.built = True
    return layer, lambda t, grads=False: {"embeddings": t["weight"]}


@register_to_torch(Embedding)
def _embedding_to(layer):
    import torch
    module = torch.nn.Embedding(layer.input_dim, layer.output_dim, dtype=getattr(torch, layer.dtype.name))
    return set_torch_params(module, {"weight": layer.params["embeddings"]})
