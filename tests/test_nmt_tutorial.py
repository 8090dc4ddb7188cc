"""The TensorFlow NMT tutorial written the tutorial's way (examples/nmt_tutorial.py: subclassed Encoder
and Decoder, a BahdanauAttention layer of three Dense layers, a GradientTape loop with teacher forcing
and a padding-masked loss), with Bahdanau's decoder in place of the tutorial's (its GRU starts from the
previous state, `BahdanauDecoder` below), computes what the fused `Seq2Seq` Bahdanau model computes: on one
batch and the same weights the same gradients (float64, 1e-9), and over an epoch the same loss curve."""
import os
import sys
import types

import numpy as np
import pytest

import attnx
from attnx.seq2seq import Seq2Seq

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import nmt_tutorial as tutorial  # noqa: E402

V_SRC, V_TGT, E, H, START = 23, 19, 5, 6, 1


class BahdanauDecoder(tutorial.Decoder):
    """The tutorial's decoder with its GRU started from the previous state (the tutorial's `self.gru(x)`
    starts from zeros): Bahdanau's decoder, which the fused Seq2Seq computes."""

    def call(self, x, hidden, enc_output):
        context_vector, attention_weights = self.attention(hidden, enc_output)
        x = attnx.ops.concatenate([attnx.ops.expand_dims(context_vector, 1), self.embedding(x)], axis=-1)
        output, state = self.gru(x, initial_state=hidden)
        return self.fc(attnx.ops.reshape(output, (-1, output.shape[2]))), state, attention_weights


@pytest.fixture
def floatx64():
    attnx.backend.set_floatx("float64")
    yield
    attnx.backend.set_floatx("float32")


def _models(dtype, batch, seed=0):
    """The fused model and the tutorial's encoder and decoder holding the same weights."""
    attnx.set_random_seed(seed)
    fused = Seq2Seq(V_SRC, V_TGT, embedding_dim=E, units=H, attention="bahdanau", cell="gru", start_token=START,
                    end_token=2, dtype=dtype)
    encoder = tutorial.Encoder(V_SRC, E, H, batch)
    decoder = BahdanauDecoder(V_TGT, E, H, batch)
    source = np.ones((batch, 3), dtype=np.int64)
    enc_output, enc_hidden = encoder(source, encoder.initialize_hidden_state())
    decoder(np.ones((batch, 1), dtype=np.int64), enc_hidden, enc_output)  # builds the decoder
    f = {n: p for n, p in fused.params.items()}
    encoder.embedding.set_weights([f["encoder/embedding/embeddings"]])
    encoder.gru.set_weights([f["encoder/rnn/kernel"], f["encoder/rnn/recurrent_kernel"], f["encoder/rnn/bias"]])
    decoder.embedding.set_weights([f["decoder/embeddings"]])
    kernel = f["decoder/kernel"]  # rows [embedding; context] in the fused kernel, [context; embedding] in the tutorial's
    decoder.gru.set_weights([np.concatenate([kernel[E:], kernel[:E]]), f["decoder/recurrent_kernel"],
                             f["decoder/bias"]])
    attention = decoder.attention
    attention.W1.set_weights([f["decoder/query_kernel"], f["decoder/query_bias"]])
    attention.W2.set_weights([f["decoder/key_kernel"], np.zeros(H)])
    attention.V.set_weights([f["decoder/score_vector"][:, None], np.zeros(1)])
    decoder.fc.set_weights([f["decoder/output_kernel"], f["decoder/output_bias"]])
    return fused, encoder, decoder


def _batch(rng, batch, source_len=5, target_len=6):
    source = rng.integers(1, V_SRC, (batch, source_len))  # no source padding: the tutorial's encoder has no mask
    target = rng.integers(3, V_TGT, (batch, target_len))
    target[:, 0] = START
    for row in range(1, batch):  # post padding of different lengths; row 0 is full
        target[row, rng.integers(2, target_len + 1):] = 0
    return source, target


def _tutorial_gradients(encoder, decoder, source, target):
    """The tutorial's train_step up to tape.gradient: (its `loss`, gradients of encoder + decoder variables)."""
    loss = 0
    with attnx.GradientTape() as tape:
        enc_output, enc_hidden = encoder(source, encoder.initialize_hidden_state())
        dec_hidden = enc_hidden
        dec_input = np.expand_dims([START] * len(source), 1)
        for t in range(1, target.shape[1]):
            predictions, dec_hidden, _ = decoder(dec_input, dec_hidden, enc_output)
            loss += tutorial.loss_function(target[:, t], predictions)
            dec_input = np.expand_dims(target[:, t], 1)
    variables = encoder.trainable_variables + decoder.trainable_variables
    return float(loss), tape.gradient(loss, variables)


def _fused_gradients(fused, source, target):
    fused.zero_grad()
    x, y = fused.train_data(source, target)
    logits, cache = fused.apply(x, training=True)
    value, dlogits = fused.loss_functions[0].compute(y, logits)
    fused.backprop(cache, dlogits)
    return value, {n: g.copy() for n, g in fused.grads.items()}


def test_tutorial_gradients_equal_the_fused_models(floatx64):
    rng = np.random.default_rng(0)
    B = 4
    fused, encoder, decoder = _models("float64", B)
    fused.compile()
    source, target = _batch(rng, B)
    loss, grads = _tutorial_gradients(encoder, decoder, source, target)
    value, expected = _fused_gradients(fused, source, target)
    # the tutorial's loss sums each step's mean over the batch; the fused model takes the mean over real words
    words = np.count_nonzero(target[:, 1:])
    assert loss * B / words == pytest.approx(value, rel=1e-12)
    scale = B / words
    got = dict(zip(["enc_embedding", "enc_kernel", "enc_recurrent", "enc_bias", "dec_embedding", "dec_kernel",
                    "dec_recurrent", "dec_bias", "fc_kernel", "fc_bias", "w1_kernel", "w1_bias", "w2_kernel",
                    "w2_bias", "v_kernel", "v_bias"], [g * scale for g in grads]))
    pairs = [("enc_embedding", "encoder/embedding/embeddings"), ("enc_kernel", "encoder/rnn/kernel"),
             ("enc_recurrent", "encoder/rnn/recurrent_kernel"), ("enc_bias", "encoder/rnn/bias"),
             ("dec_embedding", "decoder/embeddings"), ("dec_recurrent", "decoder/recurrent_kernel"),
             ("dec_bias", "decoder/bias"), ("fc_kernel", "decoder/output_kernel"), ("fc_bias", "decoder/output_bias"),
             ("w1_kernel", "decoder/query_kernel"), ("w1_bias", "decoder/query_bias"),
             ("w2_kernel", "decoder/key_kernel"), ("w2_bias", "decoder/query_bias")]
    for mine, theirs in pairs:
        np.testing.assert_allclose(got[mine], expected[theirs], rtol=1e-9, atol=1e-12, err_msg=mine)
    kernel = expected["decoder/kernel"]
    np.testing.assert_allclose(got["dec_kernel"], np.concatenate([kernel[E:], kernel[:E]]), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got["v_kernel"][:, 0], expected["decoder/score_vector"], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got["v_bias"], 0, atol=1e-12)  # a softmax does not see a shift of its scores


def test_an_epoch_follows_the_fused_models_loss_curve(monkeypatch):
    """float32, Adam, ten batches: the per-batch word-mean losses of the two models agree within float32
    noise (Adam takes the same steps from gradients that differ by a constant factor, up to its epsilon)."""
    rng = np.random.default_rng(1)
    B = 16
    fused, encoder, decoder = _models("float32", B)
    fused.compile(optimizer=attnx.optimizers.Adam(0.01))
    # the tutorial's train_step reads its globals
    for name, value in (("encoder", encoder), ("decoder", decoder), ("optimizer", attnx.optimizers.Adam(0.01)),
                        ("targ_lang", types.SimpleNamespace(word_index={"<start>": START})), ("BATCH_SIZE", B)):
        monkeypatch.setattr(tutorial, name, value)
    step = tutorial.train_step
    curves = ([], [])
    for _ in range(10):
        source, target = _batch(rng, B, source_len=7, target_len=8)
        words = np.count_nonzero(target[:, 1:])
        curves[0].append(float(step(source, target, encoder.initialize_hidden_state())) * target.shape[1] * B / words)
        curves[1].append(fused.train_on_batch(source, target))
    assert curves[1][-1] < curves[1][0]
    np.testing.assert_allclose(curves[0], curves[1], rtol=2e-3)
