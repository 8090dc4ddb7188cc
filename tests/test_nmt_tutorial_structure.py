"""examples/nmt_tutorial.py is the TensorFlow NMT-with-attention tutorial (Encoder / BahdanauAttention /
Decoder): its classes, their methods and its functions in the tutorial's order, and the bodies of the model
code, the loss and the train step equal to the tutorial's (below, as the tutorial writes them) once TensorFlow's
spelling of a call is read as attnx's (``tf.nn.tanh`` -> ``tanh``, ``tf.concat`` -> ``concatenate``, ...).
The script itself runs: two epochs on the Anki pairs, checkpoints, restore, translate and plot."""
import ast
import inspect
import os
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import nmt_tutorial as tutorial  # noqa: E402

# the tutorial's structure: classes and methods, then the functions, in its order
TUTORIAL_CLASSES = {"Encoder": ["__init__", "call", "initialize_hidden_state"],
                    "BahdanauAttention": ["__init__", "call"],
                    "Decoder": ["__init__", "call"]}
TUTORIAL_FUNCTIONS = ["preprocess_sentence", "create_dataset", "tokenize", "load_dataset", "loss_function",
                      "train_step", "evaluate", "plot_attention", "translate"]

# the tutorial's code, as it writes it (TensorFlow 2)
TUTORIAL_CODE = {
    "Encoder.call": """
def call(self, x, hidden):
    x = self.embedding(x)
    output, state = self.gru(x, initial_state = hidden)
    return output, state
""",
    "Encoder.initialize_hidden_state": """
def initialize_hidden_state(self):
    return tf.zeros((self.batch_sz, self.enc_units))
""",
    "BahdanauAttention.call": """
def call(self, query, values):
    query_with_time_axis = tf.expand_dims(query, 1)
    score = self.V(tf.nn.tanh(self.W1(query_with_time_axis) + self.W2(values)))
    attention_weights = tf.nn.softmax(score, axis=1)
    context_vector = attention_weights * values
    context_vector = tf.reduce_sum(context_vector, axis=1)
    return context_vector, attention_weights
""",
    "Decoder.call": """
def call(self, x, hidden, enc_output):
    context_vector, attention_weights = self.attention(hidden, enc_output)
    x = self.embedding(x)
    x = tf.concat([tf.expand_dims(context_vector, 1), x], axis=-1)
    output, state = self.gru(x)
    output = tf.reshape(output, (-1, output.shape[2]))
    x = self.fc(output)
    return x, state, attention_weights
""",
    "loss_function": """
def loss_function(real, pred):
    mask = tf.math.logical_not(tf.math.equal(real, 0))
    loss_ = loss_object(real, pred)
    mask = tf.cast(mask, dtype=loss_.dtype)
    loss_ *= mask
    return tf.reduce_mean(loss_)
""",
    "train_step": """
@tf.function
def train_step(inp, targ, enc_hidden):
    loss = 0
    with tf.GradientTape() as tape:
        enc_output, enc_hidden = encoder(inp, enc_hidden)
        dec_hidden = enc_hidden
        dec_input = tf.expand_dims([targ_lang.word_index['<start>']] * BATCH_SIZE, 1)
        for t in range(1, targ.shape[1]):
            predictions, dec_hidden, _ = decoder(dec_input, dec_hidden, enc_output)
            loss += loss_function(targ[:, t], predictions)
            dec_input = tf.expand_dims(targ[:, t], 1)
    batch_loss = (loss / int(targ.shape[1]))
    variables = encoder.trainable_variables + decoder.trainable_variables
    gradients = tape.gradient(loss, variables)
    optimizer.apply_gradients(zip(gradients, variables))
    return batch_loss
""",
}

# TensorFlow's names of the calls attnx spells otherwise
_TF_NAMES = {"concat": "concatenate", "reduce_sum": "sum", "reduce_mean": "mean"}
_LIBRARIES = {"tf", "ops", "attnx", "np"}


class _Normalized(ast.NodeTransformer):
    """A library call by its own name (``tf.nn.tanh`` and ``ops.tanh`` both ``tanh``); no decorators."""

    def visit_Attribute(self, node):
        root = node
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and root.id in _LIBRARIES:
            return ast.copy_location(ast.Name(id=_TF_NAMES.get(node.attr, node.attr), ctx=node.ctx), node)
        return self.generic_visit(node)

    def visit_FunctionDef(self, node):
        node.decorator_list = []
        return self.generic_visit(node)


def _shape(source):
    return ast.dump(_Normalized().visit(ast.parse(textwrap.dedent(source))), include_attributes=False)


def test_the_classes_methods_and_functions_are_the_tutorials_in_its_order():
    module = ast.parse(inspect.getsource(tutorial))
    classes = {node.name: [f.name for f in node.body if isinstance(f, ast.FunctionDef)]
               for node in module.body if isinstance(node, ast.ClassDef)}
    assert classes == TUTORIAL_CLASSES
    functions = [node.name for node in module.body if isinstance(node, ast.FunctionDef) and node.name != "main"]
    assert functions == TUTORIAL_FUNCTIONS
    assert list(classes) == list(TUTORIAL_CLASSES)


@pytest.mark.parametrize("name", list(TUTORIAL_CODE))
def test_the_model_loss_and_train_step_are_the_tutorials(name):
    obj = tutorial
    for part in name.split("."):
        obj = getattr(obj, part)
    assert _shape(inspect.getsource(obj)) == _shape(TUTORIAL_CODE[name])


def test_the_diff_can_fail():
    # the decoder as the example had it before (its GRU started from the previous state) is told apart
    changed = TUTORIAL_CODE["Decoder.call"].replace("self.gru(x)", "self.gru(x, initial_state=hidden)")
    assert _shape(changed) != _shape(TUTORIAL_CODE["Decoder.call"])


def test_the_script_trains_checkpoints_restores_and_translates(tmp_path, capsys):
    data = os.path.join(os.environ["ATTNX_DATA_DIR"], "anki", "mar.txt")
    if not os.path.exists(data):
        pytest.skip("the Anki pairs are not in ATTNX_DATA_DIR")
    pytest.importorskip("matplotlib")
    tutorial.main(["--epochs", "2", "--num-examples", "400", "--units", "16", "--embedding-dim", "8",
                   "--batch-size", "32", "--data", data, "--checkpoint-dir", str(tmp_path), "--no-plot"])
    out = capsys.readouterr().out
    assert "Epoch 2 Loss" in out and "Predicted translation:" in out
    assert (tmp_path / "ckpt-1.attnx").exists()
