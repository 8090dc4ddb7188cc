"""Keras' small utilities: `to_categorical`, `PyDataset` (and its old name `Sequence`), `plot_model`."""
import os

import numpy as np


def to_categorical(x, num_classes=None):
    """Integer class labels as one-hot float32 rows (Keras' `keras.utils.to_categorical`).

    Args:
        x: integer labels of any shape (a trailing axis of size 1 is dropped, as Keras does).
        num_classes: the number of classes (default: the largest label + 1).

    Returns:
        An array of shape ``x.shape + (num_classes,)``.
    """
    labels = np.asarray(x)
    if labels.dtype.kind == "f":
        if not np.all(labels == np.round(labels)):
            raise ValueError("to_categorical: labels must be integers, got non-integral floats")
        labels = labels.astype(np.int64)
    elif labels.dtype.kind not in "iub":
        raise TypeError(f"to_categorical: labels must be integers, got dtype {labels.dtype}")
    if labels.ndim > 1 and labels.shape[-1] == 1:
        labels = labels.reshape(labels.shape[:-1])
    if labels.size and labels.min() < 0:
        raise ValueError(f"to_categorical: labels must be >= 0, got {labels.min()}")
    if num_classes is None:
        num_classes = int(labels.max()) + 1 if labels.size else 0
    num_classes = int(num_classes)
    if labels.size and labels.max() >= num_classes:
        raise ValueError(f"to_categorical: label {labels.max()} is out of range for num_classes={num_classes}")
    out = np.zeros(labels.shape + (num_classes,), dtype=np.float32)
    np.put_along_axis(out, labels[..., None].astype(np.int64), 1.0, axis=-1)
    return out


class PyDataset:
    """A data set of batches for `fit`, `evaluate` and `predict` (Keras 3's `keras.utils.PyDataset`):
    implement ``__len__`` (the number of batches) and ``__getitem__(index)`` (batch `index`: ``(x, y)``,
    ``(x, y, sample_weight)``, or ``x`` for predict), optionally ``on_epoch_begin`` / ``on_epoch_end``.

    ``fit(shuffle=True)`` takes the batches in a new order each epoch (from `attnx.random`'s stream).
    `workers`, `use_multiprocessing` and `max_queue_size` are Keras' arguments, kept for its code; attnx loads
    the batches in the calling thread, one at a time.

    >>> import numpy as np, attnx
    >>> class Squares(attnx.utils.PyDataset):
    ...     def __len__(self):
    ...         return 3
    ...     def __getitem__(self, i):
    ...         x = np.full((4, 1), float(i), np.float32)
    ...         return x, x * x
    >>> model = attnx.Sequential([attnx.layers.Dense(1, input_shape=(1,))])
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> len(model.fit(Squares(), epochs=2, verbose=0).history["loss"])
    2
    """

    def __init__(self, workers=1, use_multiprocessing=False, max_queue_size=10):
        self.workers, self.use_multiprocessing, self.max_queue_size = workers, use_multiprocessing, max_queue_size

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__}: implement __getitem__(index), returning batch `index`")

    def __len__(self):
        raise NotImplementedError(f"{type(self).__name__}: implement __len__(), the number of batches")

    @property
    def num_batches(self):
        return len(self)

    def on_epoch_begin(self):
        """Called before each pass over the batches."""

    def on_epoch_end(self):
        """Called after each pass over the batches (e.g. to reshuffle samples between batches)."""


Sequence = PyDataset  # Keras 2's name, which Keras 3 keeps as an alias


def _import_pydot():
    try:
        import pydot
    except ImportError as exc:
        raise ImportError("plot_model: You must install pydot (`pip install pydot`) for `plot_model` to work; "
                          "images other than .dot also need graphviz's `dot` program (e.g. `apt-get install "
                          "graphviz`)") from exc
    return pydot


def model_to_dot(model, show_shapes=False, show_dtype=False, show_layer_names=True, rankdir="TB", dpi=200):
    """The model's graph as a `pydot.Dot` (Keras' `model_to_dot`): one node per layer (the inputs too), an
    edge per tensor from the layer that made it to each layer that reads it. A model written as a class has
    no graph: its layers are listed in attribute order, unconnected."""
    pydot = _import_pydot()
    if rankdir not in ("TB", "LR"):
        raise ValueError(f"plot_model: rankdir must be 'TB' (vertical) or 'LR' (horizontal), got {rankdir!r}")
    dot = pydot.Dot(graph_type="digraph", rankdir=rankdir, dpi=str(dpi), concentrate="true")
    dot.set_node_defaults(shape="record")

    def add(key, name, class_name, shape, dtype):
        label = f"{name} ({class_name})" if show_layer_names else class_name
        if show_shapes:
            label += f"|{shape}"
        if show_dtype:
            label += f"|{dtype}"
        dot.add_node(pydot.Node(key, label=label.replace("{", "(").replace("}", ")")))

    if not getattr(model, "_functional", False):
        for layer in model.layers:
            add(str(id(layer)), layer.name, type(layer).__name__, "?", layer.dtype.name)
        return dot
    for t in model.inputs:
        add(str(id(t)), t.name, "InputLayer", (None,) + tuple(t.shape[1:]), t.dtype.name)
    made_by = {id(t): str(id(t)) for t in model.inputs}
    for node in model._nodes:
        key = str(id(node.layer))
        if dot.get_node(key) == []:
            shapes = [tuple(o.shape) for o in node.outputs]
            add(key, node.layer.name, type(node.layer).__name__, shapes[0] if len(shapes) == 1 else shapes,
                node.layer.dtype.name)
        for t in node.input_tensors:
            if id(t) in made_by:
                dot.add_edge(pydot.Edge(made_by[id(t)], key))
        for o in node.outputs:
            made_by[id(o)] = key
    return dot


def plot_model(model, to_file="model.png", show_shapes=False, show_dtype=False, show_layer_names=True,
               rankdir="TB", dpi=200):
    """Draws the model's graph into `to_file` (Keras' `plot_model`): a ``.dot`` file needs pydot alone, an
    image (``.png``, ``.svg``, ``.pdf``, ...) also graphviz's `dot` program. Raises ImportError naming the
    package that is missing. Returns the `pydot.Dot`."""
    dot = model_to_dot(model, show_shapes, show_dtype, show_layer_names, rankdir, dpi)
    extension = os.path.splitext(str(to_file))[1][1:].lower() or "png"
    if extension == "dot":
        dot.write_raw(str(to_file))
        return dot
    try:
        dot.write(str(to_file), format=extension)
    except FileNotFoundError as exc:  # pydot runs `dot`: not installed
        raise ImportError("plot_model: graphviz's `dot` program was not found; install graphviz (e.g. `apt-get "
                          "install graphviz`), or write a .dot file") from exc
    return dot
