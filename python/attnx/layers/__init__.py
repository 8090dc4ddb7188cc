"""attnx layers. Every layer follows the contract in `attnx.layers.base`."""
from .attention import (AdditiveAttention, Attention, AttentionPooling, HardAttention, LocalAttention,
                        LuongAttention)
from .base import Layer, get
from .core import (Activation, Add, Concatenate, Dense, Dropout, Embedding, Flatten, GlobalAveragePooling1D,
                   Reshape)
from .transformer import (FeedForward, LayerNormalization, MultiHeadAttention, PositionalEncoding, PositionEmbedding,
                          TransformerDecoder, TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer)

__all__ = ["Layer", "AdditiveAttention", "Attention", "AttentionPooling", "HardAttention", "LocalAttention",
           "LuongAttention", "Activation", "Add", "Concatenate", "Dense", "Dropout", "Embedding", "Flatten",
           "GlobalAveragePooling1D", "Reshape"]
__all__ += ["FeedForward", "LayerNormalization", "MultiHeadAttention", "PositionalEncoding", "PositionEmbedding",
            "TransformerDecoder", "TransformerDecoderLayer", "TransformerEncoder", "TransformerEncoderLayer"]
