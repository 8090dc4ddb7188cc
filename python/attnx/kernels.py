"""The one door from Python to the C++ kernels of layers, ops and the tape (ARCHITECTURE.md, "Data
flow"): every layer module, `attnx.ops`, the decoders of `attnx.seq2seq`, `attnx.quantization`,
activations and regularizers call the kernels as ``kernels.<name>``, never `_core` itself, so this file
lists every kernel the model code runs (and `tests/test_architecture.py` keeps it so). Optimizers,
losses and process settings (`backend`) keep their own calls into `_core`: they are not layer math.
The signatures are in `_core.pyi`; the kernels themselves in ``cpp/include/attnx``.
"""
from ._core import (  # noqa: F401
    activation_backward, activation_forward, add_positions_backward, add_positions_forward,
    additive_scores_backward, additive_scores_forward, apply_keep, attention_pooling_backward,
    attention_pooling_forward, avg_pool2d_backward, avg_pool2d_forward, conv2d_backward, conv2d_forward,
    decoder_backward, decoder_forward, dense_backward, dense_forward, dense_forward_int8,
    dot_scores_backward, dot_scores_forward, draw_attend_backward, draw_read_forward, draw_write_forward,
    embedding_backward, embedding_forward, embedding_forward_int8, feed_forward_forward,
    l1l2_add_gradient, l1l2_penalty, layernorm_backward, layernorm_forward, local_window_backward,
    local_window_forward, lstmn_backward, lstmn_forward, masked_softmax_forward, max_pool2d_backward,
    max_pool2d_forward, quantize_rows, residual_add, rnn_backward, rnn_forward, rnn_forward_int8,
    sdpa_backward, sdpa_forward, sinusoidal_table, softmax_context_backward, softmax_context_forward,
)
from ._core import decoder_stack_step  # noqa: F401
from ._core import quantize_activations  # noqa: F401  (how the int8 layers quantize inputs)
# bfloat16 products (attnx.mixed_precision)
from ._core import bf16_matmul, dense_backward_bf16, dense_forward_bf16, round_to_bfloat16  # noqa: F401,E402
from ._core import dense_backward_bf16_blocks, dense_forward_bf16_blocks  # noqa: F401,E402  (q, k, v of one input)
from ._core import random_fold_in, random_keep, random_uniform  # noqa: F401  (attnx.random's stream)
from ._core import Int8Kernel, pack_int8  # noqa: F401  (int8 kernels packed once: attnx.quantization.packed)
from ._core import inference_plan  # noqa: F401,E402  (attnx.models.plan: a model's inference in one call)
# the one search of the translators (attnx.decoding): over a decoder stack, or over a Python step
from ._core import search_attention_decoder, search_decoder_stack, search_python_step  # noqa: F401,E402
from ._core import MAX_DECODING_LENGTH  # noqa: F401,E402  (search.hpp's bound, attnx.decoding's)
from ._core import batch_norm_backward, batch_norm_forward  # noqa: F401,E402  (layers.BatchNormalization)
from ._core import feed_forward_forward_int8  # noqa: F401,E402  (a quantized FeedForward in one call)
from ._core import dense_forward_int8_blocks  # noqa: F401,E402  (int8 self-attention's q, k, v apart)
from ._core import seq2seq_greedy  # noqa: F401,E402  (Seq2Seq.greedy_decode: encoder and search in one call)
from ._core import l1l2_penalty_add_gradient  # noqa: F401,E402  (a training step's regularization in one pass)
from ._core import orthogonal_factor  # noqa: F401,E402  (initializers.Orthogonal's QR, on one thread)
from ._core import zero_  # noqa: F401,E402  (ops.zero_gradients: a step's gradient buffers on every thread)
