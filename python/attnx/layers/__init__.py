"""attnx layers. Every layer follows the contract in `attnx.layers.base`."""
from .attention import Attention
from .base import Layer, get
from .core import (Activation, Add, Concatenate, Dense, Dropout, Embedding, Flatten, GlobalAveragePooling1D,
                   Reshape)
from .recurrent import GRU, LSTM, Bidirectional, GRUCell, LSTMCell, SimpleRNN, SimpleRNNCell

__all__ = ["Layer", "Attention", "Activation", "Add", "Concatenate", "Dense", "Dropout", "Embedding", "Flatten",
           "GlobalAveragePooling1D", "Reshape", "SimpleRNN", "GRU", "LSTM", "Bidirectional", "SimpleRNNCell",
           "GRUCell", "LSTMCell"]
