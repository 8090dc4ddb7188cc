"""Models: the functional `Model`, `Sequential`, models written as classes, and Keras' training
API (compile / fit / evaluate / predict, the *_on_batch steps, summary, save / load).

A functional model records every layer call made on symbolic tensors as a node
(`attnx.symbolic`). Running it walks the nodes in order, keeping each call's cache in a list that
is the model's own cache; its backward walks the nodes in reverse, handing each layer the cache of
that very call, so a layer called several times (shared weights) gets each call's gradient and
their sum in its ``grads``. Nothing about a call is stored on the model or its layers: inference in
one thread never disturbs a training step in flight in another.

Training is one loop for every model: `fit` and `evaluate` call `train_step` / `test_step`, which
run `forward`, the compiled losses and `backprop`. A model written as a class (its layers as
attributes and Keras' `call`, or its own `forward` and `backprop` like `attnx.seq2seq.Seq2Seq`) trains
through the same loop, and may override `train_data` to derive its inputs and targets from a batch.

Files: `model.py` (Model: weights, forward / backward dispatch, summary, save hooks), `graph.py`
(the functional graph's execution and config), `training.py` (compile, fit / evaluate / predict, the
steps), `sequential.py`, `loading.py` (load_model), `numerics.py` (check_numerics).
"""
from ..symbolic import Input
from .loading import load_model
from .model import Model
from .numerics import NonFiniteError
from .sequential import Sequential

__all__ = ["Input", "Model", "NonFiniteError", "Sequential", "load_model"]
