"""attnx layers. Every layer follows the contract in `attnx.layers.base`."""
from .attention import (AdditiveAttention, Attention, BahdanauAdditiveAttention, HardAttention, LocalAttention,
                        LuongAttention)
from .attention_pooling import AttentionPooling
from .base import Layer, get
from .conv import AveragePooling2D, Conv2D, MaxPooling2D
from .core import (Activation, Add, Concatenate, Dense, Dropout, Embedding, Flatten, GlobalAveragePooling1D, Masking,
                   Multiply, RepeatVector, Reshape, SpatialDropout1D)
from .conv1d import Conv1D
from .draw import FilterbankRead, FilterbankWrite
from .lambda_layer import Lambda
from .lstmn import LSTMN
from .feed_forward import FeedForward
from .multi_head_attention import MultiHeadAttention
from .normalization import BatchNormalization, LayerNormalization
from .positions import PositionalEncoding, PositionEmbedding
from .pooling import GlobalAveragePooling2D, GlobalMaxPooling1D
from .recurrent import GRU, LSTM, Bidirectional, GRUCell, LSTMCell, SimpleRNN, SimpleRNNCell
from .shape import Dot, Permute
from .time_distributed import TimeDistributed
from .transformer import TransformerDecoder, TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer

__all__ = ["Layer", "Activation", "Add", "Concatenate", "Dense", "Dropout", "Embedding", "Flatten",
           "GlobalAveragePooling1D", "Masking", "Multiply", "RepeatVector", "SpatialDropout1D", "Reshape", "SimpleRNN",
           "GRU", "LSTM", "Bidirectional", "SimpleRNNCell",
           "GRUCell", "LSTMCell", "AdditiveAttention", "BahdanauAdditiveAttention", "Attention", "AttentionPooling",
           "HardAttention",
           "LocalAttention", "LuongAttention", "FeedForward", "LayerNormalization", "MultiHeadAttention",
           "PositionalEncoding", "PositionEmbedding", "TransformerDecoder", "TransformerDecoderLayer",
           "TransformerEncoder", "TransformerEncoderLayer", "Conv2D", "MaxPooling2D", "AveragePooling2D",
           "LSTMN", "FilterbankRead", "FilterbankWrite", "TimeDistributed", "Lambda", "BatchNormalization", "Conv1D",
           "GlobalMaxPooling1D", "GlobalAveragePooling2D", "Dot", "Permute"]
