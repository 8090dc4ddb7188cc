"""attnx layers. Every layer follows the contract in `attnx.layers.base`."""
from .base import Layer, get
from .core import (Activation, Add, Concatenate, Dense, Dropout, Embedding, Flatten, GlobalAveragePooling1D,
                   Reshape)

__all__ = ["Layer", "Activation", "Add", "Concatenate", "Dense", "Dropout", "Embedding", "Flatten",
           "GlobalAveragePooling1D", "Reshape"]
from .transformer import FeedForward, LayerNormalization, PositionalEncoding, PositionEmbedding

__all__ += ["FeedForward", "LayerNormalization", "PositionalEncoding", "PositionEmbedding"]
