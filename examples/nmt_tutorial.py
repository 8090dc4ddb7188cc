"""The TensorFlow "Neural machine translation with attention" tutorial (the Encoder / BahdanauAttention /
Decoder version), line for line with attnx in place of TensorFlow, on the Anki Marathi -> English pairs.

    python examples/nmt_tutorial.py [--epochs 10] [--num-examples 30000] [--data PATH] [--checkpoint-dir DIR]

The tutorial's names, classes, methods and order are kept: its data preparation (`preprocess_sentence`,
`create_dataset`, `tokenize`, `load_dataset`), a `tf.data`-style pipeline (`attnx.data.Dataset`:
from_tensor_slices, shuffle, batch with drop_remainder, take), the Encoder, the BahdanauAttention layer of
three Dense layers, the Decoder (whose GRU starts from zeros at every step, `self.gru(x)`, as the tutorial's:
the previous state reaches a step only through the attention query), the masked loss, checkpoints of the
optimizer, encoder and decoder (`attnx.train.Checkpoint`), the GradientTape `train_step`, the training loop,
`evaluate`, `plot_attention` and `translate`. Where attnx spells a TensorFlow call differently, the line
says which call it stands for; the tutorial's module-level script is `main()`, which sets the globals the
tutorial's functions read. `tests/test_nmt_tutorial_structure.py` diffs this file's structure against the
tutorial's.
"""
import argparse
import os
import time

import numpy as np

import attnx
from attnx import layers, ops

# the tutorial's globals, set by main() (its script part)
BATCH_SIZE = 64
units = 1024
encoder = decoder = optimizer = checkpoint = inp_lang = targ_lang = None
max_length_inp = max_length_targ = None


def preprocess_sentence(w):
    # the tutorial's unicode_to_ascii, lowercasing, spaces around punctuation and <start> / <end>; attnx's
    # keeps Devanagari's vowel signs, which the tutorial's accent stripping would drop
    return attnx.datasets.preprocess_sentence(w)


def create_dataset(path, num_examples):
    # 1. Remove the accents  2. Clean the sentences  3. Return word pairs in the format: [ENGLISH, MARATHI]
    lines = open(path, encoding="UTF-8").read().strip().split("\n")  # io.open
    word_pairs = [[preprocess_sentence(w) for w in line.split("\t")[:2]] for line in lines[:num_examples]]
    return zip(*word_pairs)


def tokenize(lang):
    lang_tokenizer = attnx.text.Tokenizer(filters="")  # tf.keras.preprocessing.text.Tokenizer
    lang_tokenizer.fit_on_texts(lang)
    tensor = lang_tokenizer.texts_to_sequences(lang)
    tensor = attnx.text.pad_sequences(tensor, padding="post")  # tf.keras.preprocessing.sequence.pad_sequences
    return tensor, lang_tokenizer


def load_dataset(path, num_examples=None):
    # creating cleaned input, output pairs
    targ_lang, inp_lang = create_dataset(path, num_examples)
    input_tensor, inp_lang_tokenizer = tokenize(inp_lang)
    target_tensor, targ_lang_tokenizer = tokenize(targ_lang)
    return input_tensor, target_tensor, inp_lang_tokenizer, targ_lang_tokenizer


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
        return ops.zeros((self.batch_sz, self.enc_units))  # tf.zeros


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
        # we are doing this to broadcast addition along the time axis to calculate the score
        query_with_time_axis = ops.expand_dims(query, 1)
        # score shape == (batch_size, max_length, 1)
        # we get 1 at the last axis because we are applying score to self.V
        # the shape of the tensor before applying self.V is (batch_size, max_length, units)
        score = self.V(ops.tanh(self.W1(query_with_time_axis) + self.W2(values)))  # tf.nn.tanh
        # attention_weights shape == (batch_size, max_length, 1)
        attention_weights = ops.softmax(score, axis=1)  # tf.nn.softmax
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
        x = ops.concatenate([ops.expand_dims(context_vector, 1), x], axis=-1)  # tf.concat
        # passing the concatenated vector to the GRU
        output, state = self.gru(x)
        # output shape == (batch_size * 1, hidden_size)
        output = ops.reshape(output, (-1, output.shape[2]))
        # output shape == (batch_size, vocab)
        x = self.fc(output)
        return x, state, attention_weights


loss_object = attnx.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")


def loss_function(real, pred):
    mask = ops.logical_not(ops.equal(real, 0))  # tf.math.logical_not(tf.math.equal(real, 0))
    loss_ = loss_object(real, pred)
    mask = ops.cast(mask, dtype=loss_.dtype)
    loss_ *= mask
    return ops.mean(loss_)  # tf.reduce_mean


def train_step(inp, targ, enc_hidden):  # @tf.function: attnx runs eagerly
    loss = 0
    with attnx.GradientTape() as tape:
        enc_output, enc_hidden = encoder(inp, enc_hidden)
        dec_hidden = enc_hidden
        dec_input = ops.expand_dims([targ_lang.word_index["<start>"]] * BATCH_SIZE, 1)
        # Teacher forcing - feeding the target as the next input
        for t in range(1, targ.shape[1]):
            # passing enc_output to the decoder
            predictions, dec_hidden, _ = decoder(dec_input, dec_hidden, enc_output)
            loss += loss_function(targ[:, t], predictions)
            # using teacher forcing
            dec_input = ops.expand_dims(targ[:, t], 1)
    batch_loss = (loss / int(targ.shape[1]))
    variables = encoder.trainable_variables + decoder.trainable_variables
    gradients = tape.gradient(loss, variables)
    optimizer.apply_gradients(zip(gradients, variables))
    return batch_loss


def evaluate(sentence):
    attention_plot = np.zeros((max_length_targ, max_length_inp))
    sentence = preprocess_sentence(sentence)
    inputs = [inp_lang.word_index[i] for i in sentence.split(" ")]
    inputs = attnx.text.pad_sequences([inputs], maxlen=max_length_inp, padding="post")
    inputs = np.asarray(inputs)  # tf.convert_to_tensor: NumPy arrays are attnx's tensors
    result = ""
    hidden = [ops.zeros((1, units))]
    enc_out, enc_hidden = encoder(inputs, hidden)
    dec_hidden = enc_hidden
    dec_input = ops.expand_dims([targ_lang.word_index["<start>"]], 0)
    for t in range(max_length_targ):
        predictions, dec_hidden, attention_weights = decoder(dec_input, dec_hidden, enc_out)
        # storing the attention weights to plot later on
        attention_weights = ops.reshape(attention_weights, (-1,))
        attention_plot[t] = np.asarray(attention_weights)  # .numpy()
        predicted_id = int(ops.argmax(predictions[0]))  # tf.argmax(...).numpy()
        result += targ_lang.index_word[predicted_id] + " "
        if targ_lang.index_word[predicted_id] == "<end>":
            return result, sentence, attention_plot
        # the predicted ID is fed back into the model
        dec_input = ops.expand_dims([predicted_id], 0)
    return result, sentence, attention_plot


# function for plotting the attention weights
def plot_attention(attention, sentence, predicted_sentence):
    import matplotlib.pyplot as plt
    import matplotlib.ticker as ticker
    fig = plt.figure(figsize=(10, 10))
    ax = fig.add_subplot(1, 1, 1)
    ax.matshow(attention, cmap="viridis")
    fontdict = {"fontsize": 14}
    ax.set_xticklabels([""] + sentence, fontdict=fontdict, rotation=90)
    ax.set_yticklabels([""] + predicted_sentence, fontdict=fontdict)
    ax.xaxis.set_major_locator(ticker.MultipleLocator(1))
    ax.yaxis.set_major_locator(ticker.MultipleLocator(1))
    plt.show()
    return fig


def translate(sentence):
    result, sentence, attention_plot = evaluate(sentence)
    print("Input:", sentence)
    print("Predicted translation:", result)
    attention_plot = attention_plot[:len(result.split(" ")), :len(sentence.split(" "))]
    return plot_attention(attention_plot, sentence.split(" "), result.split(" "))


def main(argv=None):
    """The tutorial's script: data, model, checkpoints, training, then a translation from the last checkpoint."""
    global encoder, decoder, optimizer, checkpoint, inp_lang, targ_lang, max_length_inp, max_length_targ
    global BATCH_SIZE, units
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--num-examples", type=int, default=30000)
    parser.add_argument("--units", type=int, default=1024)
    parser.add_argument("--embedding-dim", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--data", default=None, help="path of mar.txt (default: $ATTNX_DATA_DIR/anki/mar.txt)")
    parser.add_argument("--checkpoint-dir", default="./training_checkpoints")
    parser.add_argument("--no-plot", action="store_true", help="skip the attention plot's window (matplotlib Agg)")
    args = parser.parse_args(argv)
    if args.no_plot:
        import matplotlib
        matplotlib.use("Agg")
    path_to_file = args.data or os.path.join(os.environ.get("ATTNX_DATA_DIR", "../shared/data"), "anki", "mar.txt")
    attnx.set_random_seed(0)
    input_tensor, target_tensor, inp_lang, targ_lang = load_dataset(path_to_file, args.num_examples)
    # Calculate max_length of the target tensors
    max_length_targ, max_length_inp = target_tensor.shape[1], input_tensor.shape[1]
    # (the tutorial holds 20% out with sklearn's train_test_split; the loop trains on the rest)
    split = int(len(input_tensor) * 0.8)
    input_tensor_train, target_tensor_train = input_tensor[:split], target_tensor[:split]

    BUFFER_SIZE = len(input_tensor_train)
    BATCH_SIZE = args.batch_size
    steps_per_epoch = len(input_tensor_train) // BATCH_SIZE
    embedding_dim = args.embedding_dim
    units = args.units
    vocab_inp_size = len(inp_lang.word_index) + 1
    vocab_tar_size = len(targ_lang.word_index) + 1
    dataset = attnx.data.Dataset.from_tensor_slices((input_tensor_train, target_tensor_train)).shuffle(BUFFER_SIZE)
    dataset = dataset.batch(BATCH_SIZE, drop_remainder=True)

    encoder = Encoder(vocab_inp_size, embedding_dim, units, BATCH_SIZE)
    decoder = Decoder(vocab_tar_size, embedding_dim, units, BATCH_SIZE)
    optimizer = attnx.optimizers.Adam()

    checkpoint_dir = args.checkpoint_dir
    checkpoint_prefix = os.path.join(checkpoint_dir, "ckpt")
    checkpoint = attnx.train.Checkpoint(optimizer=optimizer, encoder=encoder, decoder=decoder)

    EPOCHS = args.epochs
    for epoch in range(EPOCHS):
        start = time.time()
        enc_hidden = encoder.initialize_hidden_state()
        total_loss = 0
        for (batch, (inp, targ)) in enumerate(dataset.take(steps_per_epoch)):
            batch_loss = train_step(inp, targ, enc_hidden)
            total_loss += batch_loss
            if batch % 100 == 0:
                print(f"Epoch {epoch + 1} Batch {batch} Loss {float(batch_loss):.4f}")
        # saving (checkpoint) the model every 2 epochs
        if (epoch + 1) % 2 == 0:
            checkpoint.save(file_prefix=checkpoint_prefix)
        print(f"Epoch {epoch + 1} Loss {float(total_loss) / steps_per_epoch:.4f}")
        print(f"Time taken for 1 epoch {time.time() - start:.2f} sec\n")

    # restoring the latest checkpoint in checkpoint_dir
    checkpoint.restore(attnx.train.latest_checkpoint(checkpoint_dir))
    sentence = preprocess_sentence(open(path_to_file, encoding="UTF-8").readline().split("\t")[1])[8:-6]
    translate(sentence)


if __name__ == "__main__":
    main()
