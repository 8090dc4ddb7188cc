"""attnx layers. Every layer follows the contract in `attnx.layers.base`."""
from .attention import Attention
from .base import Layer, get
from .core import (Activation, Add, Concatenate, Dense, Dropout, Embedding, Flatten, GlobalAveragePooling1D,
                   Reshape)
from .transformer import (FeedForward, LayerNormalization, MultiHeadAttention, PositionalEncoding, PositionEmbedding,
                          TransformerDecoder, TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer)

__all__ = ["Layer", "Attention", "Activation", "Add", "Concatenate", "Dense", "Dropout", "Embedding", "Flatten",
           "GlobalAveragePooling1D", "Reshape",
           "FeedForward", "LayerNormalization", "MultiHeadAttention", "PositionalEncoding", "PositionEmbedding",
           "TransformerDecoder", "TransformerDecoderLayer", "TransformerEncoder", "TransformerEncoderLayer"]
