"""The TensorFlow "Neural machine translation with attention" tutorial, written the tutorial's way
(Encoder and Decoder models, a BahdanauAttention layer of three Dense layers, a GradientTape loop
with teacher forcing and a padding-masked loss), with attnx in place of tf.keras, on the
English -> Marathi pairs.

    python examples/nmt_tutorial.py [--epochs 2] [--pairs 4000] [--units 256] [--data PATH]

Each class and function keeps the tutorial's name and lines; where attnx spells a TensorFlow call
differently the line says so. One change is the model's: the tutorial's decoder calls
``self.gru(x)``, starting its GRU from zeros at every step, so the decoder state reaches the next step
only through the attention query; here it is ``self.gru(x, initial_state=hidden)``, Bahdanau's
decoder, which is also what the fused `attnx.seq2seq.Seq2Seq` computes (the tests check that one
batch gives both the same gradients).
"""
import argparse
import os
import time

import numpy as np

import attnx
from attnx import layers, ops


class Encoder(attnx.Model):
    def __init__(self, vocab_size, embedding_dim, enc_units, batch_sz, **kwargs):
        super().__init__(**kwargs)
        self.batch_sz = batch_sz
        self.enc_units = enc_units
        self.embedding = layers.Embedding(vocab_size, embedding_dim)
        self.gru = layers.GRU(self.enc_units, return_sequences=True, return_state=True,
                              recurrent_initializer="glorot_uniform")

    def call(self, x, hidden):
        x = self.embedding(x)
        output, state = self.gru(x, initial_state=hidden)
        return output, state

    def initialize_hidden_state(self):
        return np.zeros((self.batch_sz, self.enc_units), dtype=self.dtype)  # tf.zeros


class BahdanauAttention(layers.Layer):
    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.W1 = layers.Dense(units)
        self.W2 = layers.Dense(units)
        self.V = layers.Dense(1)

    def call(self, query, values):
        # query hidden state shape == (batch_size, hidden size)
        # query_with_time_axis shape == (batch_size, 1, hidden size)
        # values shape == (batch_size, max_len, hidden size)
        query_with_time_axis = ops.expand_dims(query, 1)
        # score shape == (batch_size, max_length, 1)
        score = self.V(ops.tanh(self.W1(query_with_time_axis) + self.W2(values)))
        # attention_weights shape == (batch_size, max_length, 1)
        attention_weights = ops.softmax(score, axis=1)
        # context_vector shape after sum == (batch_size, hidden_size)
        context_vector = attention_weights * values
        context_vector = ops.sum(context_vector, axis=1)  # tf.reduce_sum
        return context_vector, attention_weights


class Decoder(attnx.Model):
    def __init__(self, vocab_size, embedding_dim, dec_units, batch_sz, **kwargs):
        super().__init__(**kwargs)
        self.batch_sz = batch_sz
        self.dec_units = dec_units
        self.embedding = layers.Embedding(vocab_size, embedding_dim)
        self.gru = layers.GRU(self.dec_units, return_sequences=True, return_state=True,
                              recurrent_initializer="glorot_uniform")
        self.fc = layers.Dense(vocab_size)
        # used for attention
        self.attention = BahdanauAttention(self.dec_units)

    def call(self, x, hidden, enc_output):
        # enc_output shape == (batch_size, max_length, hidden_size)
        context_vector, attention_weights = self.attention(hidden, enc_output)
        # x shape after passing through embedding == (batch_size, 1, embedding_dim)
        x = self.embedding(x)
        # x shape after concatenation == (batch_size, 1, embedding_dim + hidden_size)
        x = ops.concatenate([ops.expand_dims(context_vector, 1), x], axis=-1)
        # passing the concatenated vector to the GRU (the tutorial: self.gru(x); see the module docstring)
        output, state = self.gru(x, initial_state=hidden)
        # output shape == (batch_size * 1, hidden_size)
        output = ops.reshape(output, (-1, output.shape[2]))
        # output shape == (batch_size, vocab)
        x = self.fc(output)
        return x, state, attention_weights


loss_object = attnx.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")


def loss_function(real, pred):
    mask = np.logical_not(np.equal(real, 0))  # tf.math.logical_not(tf.math.equal(real, 0))
    loss_ = loss_object(real, pred)
    mask = mask.astype(loss_.dtype)  # tf.cast(mask, dtype=loss_.dtype)
    loss_ *= mask
    return ops.mean(loss_)  # tf.reduce_mean


def make_train_step(encoder, decoder, optimizer, start_id):
    """The tutorial's `train_step` (its globals passed in)."""

    def train_step(inp, targ, enc_hidden):
        loss = 0
        with attnx.GradientTape() as tape:
            enc_output, enc_hidden = encoder(inp, enc_hidden)
            dec_hidden = enc_hidden
            dec_input = np.expand_dims([start_id] * len(inp), 1)  # tf.expand_dims
            # Teacher forcing - feeding the target as the next input
            for t in range(1, targ.shape[1]):
                # passing enc_output to the decoder
                predictions, dec_hidden, _ = decoder(dec_input, dec_hidden, enc_output)
                loss += loss_function(targ[:, t], predictions)
                # using teacher forcing
                dec_input = np.expand_dims(targ[:, t], 1)
        batch_loss = (loss / int(targ.shape[1]))
        variables = encoder.trainable_variables + decoder.trainable_variables
        gradients = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(gradients, variables))
        return batch_loss

    return train_step


def evaluate(sentence, encoder, decoder, inp_lang, targ_lang, max_length_inp, max_length_targ):
    """Greedy translation of one preprocessed sentence and its attention plot (the tutorial's)."""
    attention_plot = np.zeros((max_length_targ, max_length_inp))
    inputs = [inp_lang.word_index[i] for i in sentence.split(" ")]
    inputs = attnx.text.pad_sequences([inputs], maxlen=max_length_inp, padding="post")
    result = []
    hidden = np.zeros((1, encoder.enc_units), dtype="float32")
    enc_out, enc_hidden = encoder(inputs, hidden)
    dec_hidden = enc_hidden
    dec_input = np.expand_dims([targ_lang.word_index["<start>"]], 0)
    for t in range(max_length_targ):
        predictions, dec_hidden, attention_weights = decoder(dec_input, dec_hidden, enc_out)
        attention_plot[t] = attention_weights.reshape(-1)
        predicted_id = int(np.argmax(predictions[0]))
        result.append(targ_lang.index_word[predicted_id])
        if targ_lang.index_word[predicted_id] == "<end>":
            return " ".join(result), sentence, attention_plot[:t + 1, :len(sentence.split(" "))]
        dec_input = np.expand_dims([predicted_id], 0)
    return " ".join(result), sentence, attention_plot[:, :len(sentence.split(" "))]


def load_dataset(path, num_examples, seed=0):
    """Tokenized, post-padded tensors and the tokenizers (the tutorial's `load_dataset`)."""
    pairs = attnx.datasets.load_anki_pairs(path=path, max_words=10, split=(1.0, 0.0, 0.0), seed=seed).train
    inp, targ = list(pairs.source[:num_examples]), list(pairs.target[:num_examples])
    inp_lang, targ_lang = attnx.text.Tokenizer(filters=""), attnx.text.Tokenizer(filters="")
    inp_lang.fit_on_texts(inp)
    targ_lang.fit_on_texts(targ)
    input_tensor = attnx.text.pad_sequences(inp_lang.texts_to_sequences(inp), padding="post")
    target_tensor = attnx.text.pad_sequences(targ_lang.texts_to_sequences(targ), padding="post")
    return input_tensor, target_tensor, inp_lang, targ_lang


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=4000)
    parser.add_argument("--units", type=int, default=256)
    parser.add_argument("--embedding-dim", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--data", default=None, help="path of mar.txt (default: $ATTNX_DATA_DIR/anki/mar.txt)")
    args = parser.parse_args()
    path = args.data or os.path.join(os.environ.get("ATTNX_DATA_DIR", "../shared/data"), "anki", "mar.txt")
    attnx.set_random_seed(0)
    input_tensor, target_tensor, inp_lang, targ_lang = load_dataset(path, args.pairs)
    BATCH_SIZE = args.batch_size
    steps_per_epoch = len(input_tensor) // BATCH_SIZE
    vocab_inp_size, vocab_tar_size = len(inp_lang.word_index) + 1, len(targ_lang.word_index) + 1
    encoder = Encoder(vocab_inp_size, args.embedding_dim, args.units, BATCH_SIZE)
    decoder = Decoder(vocab_tar_size, args.embedding_dim, args.units, BATCH_SIZE)
    optimizer = attnx.optimizers.Adam()
    train_step = make_train_step(encoder, decoder, optimizer, targ_lang.word_index["<start>"])
    rng = np.random.default_rng(0)
    for epoch in range(args.epochs):
        start = time.time()
        enc_hidden = encoder.initialize_hidden_state()
        total_loss = 0
        order = rng.permutation(len(input_tensor))
        for batch in range(steps_per_epoch):
            rows = order[batch * BATCH_SIZE:(batch + 1) * BATCH_SIZE]
            batch_loss = train_step(input_tensor[rows], target_tensor[rows], enc_hidden)
            total_loss += float(batch_loss)
        print(f"Epoch {epoch + 1} Loss {total_loss / steps_per_epoch:.4f} ({time.time() - start:.1f} s)")
    sentence = "<start> i am hungry . <end>"
    result, _, attention = evaluate(sentence, encoder, decoder, inp_lang, targ_lang, input_tensor.shape[1],
                                    target_tensor.shape[1])
    print(f"Input: {sentence}\nPredicted translation: {result}\nattention {attention.shape}")


if __name__ == "__main__":
    main()
