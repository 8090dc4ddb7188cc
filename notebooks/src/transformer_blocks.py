# %% [markdown]
# # Transformer building blocks
#
# The pieces of the transformer (Vaswani et al., 2017), one at a time, each checked against a
# few lines of NumPy, and then a small transformer classifier trained on review sentences:
#
# 1. self-attention from queries, keys and values, by hand and with `scaled_dot_product_attention`
# 2. multi-head attention (`layers.MultiHeadAttention`, Keras' signature) and its per-head weights
# 3. the sinusoidal positional encoding (`layers.PositionalEncoding`)
# 4. a transformer encoder classifier on the UCI sentences, and what its heads attend to
#
# attnx layers are called like Keras layers on NumPy arrays (batch first: `(batch, time, features)`)
# and return NumPy arrays; their weights are NumPy arrays in `layer.params`.

# %%
import os
import time

import matplotlib.pyplot as plt
import numpy as np

import attnx
from attnx import layers
from attnx.layers.attention import scaled_dot_product_attention

QUICK = os.environ.get("ATTNX_QUICK") == "1"  # set by the test suite: little data, one epoch
attnx.set_random_seed(0)
rng = np.random.default_rng(0)
np.set_printoptions(precision=3, suppress=True)

# %% [markdown]
# ## 1. Self-attention from Q, K and V
#
# Take a "sentence" of $T = 5$ token vectors $X \in \mathbb{R}^{T \times d}$ ($d = 8$). Self-attention
# projects every token three ways, to a query, a key and a value,
#
# $$Q = X W_Q, \qquad K = X W_K, \qquad V = X W_V \qquad (W_Q, W_K \in \mathbb{R}^{d \times d_k},\ W_V \in \mathbb{R}^{d \times d_v}),$$
#
# scores every query against every key, normalizes each row with a softmax, and mixes the values:
#
# $$\mathrm{Attention}(Q, K, V) = \underbrace{\mathrm{softmax}\Big(\frac{Q K^\top}{\sqrt{d_k}}\Big)}_{A\ (T \times T)} V$$
#
# The $1/\sqrt{d_k}$ keeps the dot products from growing with $d_k$ and saturating the softmax.

# %%
tokens = ["the", "battery", "lasts", "all", "day"]
T, d, d_k = len(tokens), 8, 4
X = rng.normal(size=(1, T, d)).astype(np.float32)
W_Q, W_K, W_V = (rng.normal(size=(d, d_k)).astype(np.float32) for _ in range(3))
Q, K, V = X @ W_Q, X @ W_K, X @ W_V                      # (1, T, d_k) each

scores = Q[0] @ K[0].T / np.sqrt(d_k)                    # (T, T)
A = np.exp(scores - scores.max(axis=1, keepdims=True))
A /= A.sum(axis=1, keepdims=True)
out_numpy = A @ V[0]

out, weights = scaled_dot_product_attention(Q, K, V)     # weights: (batch, heads, T, T)
print("attention matrix A (rows: queries, columns: keys):\n", weights[0, 0])
assert np.allclose(weights[0, 0], A, atol=1e-5) and np.allclose(out[0], out_numpy, atol=1e-5)
print("scaled_dot_product_attention matches NumPy")

# %% [markdown]
# Two masks change which keys a query may see (True = may attend, as in Keras). A *padding* mask
# `(batch, S)` hides padding tokens from every query; a *causal* mask lets position $t$ see only
# positions $\le t$, what a decoder needs so it cannot peek at the words it must predict. Masked
# scores are set to $-\infty$ before the softmax, so their weights are exactly 0:

# %%
_, w_causal = scaled_dot_product_attention(Q, K, V, causal=True)
_, w_pad = scaled_dot_product_attention(Q, K, V, mask=np.array([[True, True, True, False, False]]))
causal_numpy = np.where(np.tril(np.ones((T, T), bool)), np.exp(scores), 0.0)
assert np.allclose(w_causal[0, 0], causal_numpy / causal_numpy.sum(axis=1, keepdims=True), atol=1e-5)

fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
for ax, w, title in zip(axes, [weights, w_causal, w_pad], ["no mask", "causal", "padding: last two hidden"]):
    attnx.plot.attention_heatmap(w[0, 0], source_tokens=tokens, target_tokens=tokens, ax=ax, title=title)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## 2. Multi-head attention
#
# One attention matrix can only express one way of relating tokens. Multi-head attention runs $H$
# attentions side by side on smaller projections and concatenates them:
#
# $$\mathrm{head}_h = \mathrm{Attention}(X W_Q^{(h)}, X W_K^{(h)}, X W_V^{(h)}), \qquad
#   \mathrm{MHA}(X) = [\mathrm{head}_1; \dots; \mathrm{head}_H]\, W_O$$
#
# `layers.MultiHeadAttention(num_heads, key_dim)` has Keras' signature and weight shapes:
# `query_kernel` is `(d, H, key_dim)`, `output_kernel` `(H, value_dim, d_out)`, plus biases. Call it
# as `mha(query, value)` (self-attention: `mha(x, x)`); `return_attention_scores=True` returns the
# weights of every head, `(batch, H, T, S)`.

# %%
H = 4
mha = layers.MultiHeadAttention(num_heads=H, key_dim=4)
y, head_weights = mha(X, X, return_attention_scores=True)
for name, w in mha.params.items():
    print(f"{name:14s} {w.shape}")
print("output", y.shape, " weights", head_weights.shape)

# %% [markdown]
# By hand: each head's projections are slices of the kernels, each head is the attention of
# section 1, and the output projection sums over heads.

# %%
P = mha.params
y_numpy = P["output_bias"].copy()
for h in range(H):
    q = X[0] @ P["query_kernel"][:, h] + P["query_bias"][h]
    k = X[0] @ P["key_kernel"][:, h] + P["key_bias"][h]
    v = X[0] @ P["value_kernel"][:, h] + P["value_bias"][h]
    s = q @ k.T / np.sqrt(4)
    a = np.exp(s - s.max(axis=1, keepdims=True))
    a /= a.sum(axis=1, keepdims=True)
    assert np.allclose(head_weights[0, h], a, atol=1e-5)
    y_numpy = y_numpy + (a @ v) @ P["output_kernel"][h]
assert np.allclose(y[0], y_numpy, atol=1e-4)
print("MultiHeadAttention matches NumPy")

fig, axes = plt.subplots(1, H, figsize=(16, 3.6))
for h, ax in enumerate(axes):
    attnx.plot.attention_heatmap(head_weights[0, h], source_tokens=tokens, target_tokens=tokens, ax=ax,
                                 title=f"head {h}", colorbar=False)
fig.tight_layout()
plt.show()

# %% [markdown]
# What to look at: the four heads see the same tokens but, with different projections, distribute
# their attention differently (these weights are random; section 4 shows trained heads).

# %% [markdown]
# ## 3. Positional encoding
#
# Attention itself ignores order: permuting the tokens permutes the outputs the same way. The
# transformer therefore adds a position signal to each token embedding, a sinusoid whose
# wavelength grows geometrically from $2\pi$ to $10000 \cdot 2\pi$ along the feature axis:
#
# $$PE_{t,\,2i} = \sin\big(t / 10000^{2i/D}\big), \qquad PE_{t,\,2i+1} = \cos\big(t / 10000^{2i/D}\big)$$
#
# `layers.PositionalEncoding()` adds this table to its input (no weights, any length).

# %%
T_max, D = 64, 32
pos_layer = layers.PositionalEncoding()
pe = pos_layer(np.zeros((1, T_max, D), np.float32))[0]   # adding to zeros shows the table itself

t = np.arange(T_max)[:, None]
i = np.arange(D // 2)[None, :]
pe_numpy = np.zeros((T_max, D))
pe_numpy[:, 0::2] = np.sin(t / 10000 ** (2 * i / D))
pe_numpy[:, 1::2] = np.cos(t / 10000 ** (2 * i / D))
assert np.allclose(pe, pe_numpy, atol=1e-5)

fig, axes = plt.subplots(1, 3, figsize=(16, 4))
im = axes[0].imshow(pe.T, cmap="RdBu", aspect="auto")
axes[0].set_xlabel("position t")
axes[0].set_ylabel("feature")
axes[0].set_title("PE (features x positions)")
fig.colorbar(im, ax=axes[0])
for f in [0, 2, 8, 16]:
    axes[1].plot(pe[:, f], label=f"feature {f}")
axes[1].set_xlabel("position t")
axes[1].set_title("sin features: wavelength grows with the feature")
axes[1].legend(fontsize=8)
sim = pe @ pe.T
im = axes[2].imshow(sim, cmap="viridis")
axes[2].set_title(r"$PE_t \cdot PE_{t'}$: depends on $t - t'$ only")
axes[2].set_xlabel("t'")
axes[2].set_ylabel("t")
fig.colorbar(im, ax=axes[2])
fig.tight_layout()
plt.show()

# %% [markdown]
# What to look at: low features oscillate fast and high features slowly, so every position gets a
# distinct pattern (left, middle). The dot product of two encodings (right) is a function of their
# distance alone, largest on the diagonal, which is what lets attention learn relative positions.

# %% [markdown]
# ## 4. A transformer classifier on review sentences
#
# Now the blocks together, on the UCI Sentiment Labelled Sentences (Kotzias et al., 2015): 1000
# Amazon and 1000 Yelp review sentences labelled positive or negative. This is the model of
# `examples/transformer_sentiment.py`:
#
# `Embedding(mask_zero=True)` (32 dims) → `PositionalEncoding` → `TransformerEncoder` (2 layers of
# [multi-head self-attention with 2 heads → add & layer-norm → feed-forward 64 → add & layer-norm],
# dropout 0.1) → `GlobalAveragePooling1D` (over real tokens only) → `Dropout(0.3)` → `Dense(1, sigmoid)`.
#
# The padding mask made by the embedding flows to the encoder (padding is never attended to) and
# to the pooling. The vocabulary (3000 words) is built from the training 80% only.

# %%
MAX_LEN, NUM_WORDS = 32, 3000
EPOCHS = 1 if QUICK else 8
SEEDS = [0] if QUICK else [0, 1, 2]

sentences, labels = attnx.datasets.load_uci_sentiment(sources=("amazon", "yelp"))
order = np.random.default_rng(0).permutation(len(sentences))
sentences = [sentences[i] for i in order]
labels = labels[order].astype(np.float32)
if QUICK:
    sentences, labels = sentences[:400], labels[:400]
cut = int(0.8 * len(sentences))
tokenizer = attnx.text.Tokenizer(num_words=NUM_WORDS)
tokenizer.fit_on_texts(sentences[:cut])
ids = attnx.text.pad_sequences(tokenizer.texts_to_sequences(sentences), maxlen=MAX_LEN, padding="post",
                               truncating="post").astype(np.int64)
print(ids.shape, "training", cut, "validation", len(ids) - cut)


def build_model(dim=32, heads=2, num_layers=2):
    return attnx.Sequential([
        attnx.Input((MAX_LEN,), dtype="int64"),
        layers.Embedding(NUM_WORDS, dim, mask_zero=True),
        layers.PositionalEncoding(),
        layers.TransformerEncoder(num_layers, heads, intermediate_dim=2 * dim, dropout=0.1),
        layers.GlobalAveragePooling1D(),
        layers.Dropout(0.3),
        layers.Dense(1, activation="sigmoid"),
    ])


build_model().summary()

# %% [markdown]
# Training: Adam (learning rate $10^{-3}$), binary cross-entropy, batch 32, 8 epochs, the last 20%
# held out (`validation_split=0.2`), from three seeds; the curves are seed 0's.

# %%
finals, histories = [], []
for seed in SEEDS:
    attnx.set_random_seed(seed)
    model = build_model()
    model.compile(optimizer=attnx.optimizers.Adam(1e-3), loss="binary_crossentropy", metrics=["accuracy"])
    start = time.perf_counter()
    history = model.fit(ids, labels, epochs=EPOCHS, batch_size=32, validation_split=0.2,
                        verbose=2 if seed == SEEDS[0] else 0)
    finals.append(history.history["val_accuracy"][-1])
    histories.append(history)
    print(f"seed {seed}: final validation accuracy {finals[-1]:.4f} ({time.perf_counter() - start:.0f} s)")
    if seed == SEEDS[0]:
        trained = model
print(f"transformer: mean final validation accuracy {np.mean(finals):.4f} over seeds {SEEDS}")

fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
attnx.plot.plot_history(histories[0], metrics=("loss",), ax=axes[0])
attnx.plot.plot_history(histories[0], metrics=("accuracy",), ax=axes[1])
fig.tight_layout()
plt.show()

# %% [markdown]
# What to look at: as with the LSTM in `sentiment_attention.ipynb`, the training accuracy goes
# towards 1 and validation accuracy stops improving after a few epochs; 2000 sentences are little
# data for a transformer, which is why this one is kept tiny (about 100k parameters, most of
# them in the embedding).
#
# ## What do the trained heads attend to?
#
# We run the trained layers by hand on a few validation sentences and ask the encoder for its
# weights: `TransformerEncoder(..., return_attention_scores=True)` returns one `(batch, heads, T, T)`
# array per layer.

# %%
embedding, positions, encoder = trained.layers[:3]
examples = sentences[cut:][:2] + ["the food was great but the service was terrible"]
ex_ids = attnx.text.pad_sequences(tokenizer.texts_to_sequences(examples), maxlen=MAX_LEN, padding="post",
                                  truncating="post").astype(np.int64)
mask = ex_ids != 0
_, layer_weights = encoder(positions(embedding(ex_ids)), padding_mask=mask, return_attention_scores=True)
print(len(layer_weights), "layers, weights", layer_weights[0].shape)
prob = trained.predict(ex_ids)[:, 0]

for b, text in enumerate(examples):
    n = int(mask[b].sum())
    words = [tokenizer.index_word[i] for i in ex_ids[b, :n]]
    fig, axes = plt.subplots(1, 4, figsize=(4 * max(4.0, 0.5 * n), max(3.2, 0.45 * n)))
    for ax, (layer_index, head) in zip(axes, [(0, 0), (0, 1), (1, 0), (1, 1)]):
        attnx.plot.attention_heatmap(layer_weights[layer_index][b, head, :n, :n], source_tokens=words,
                                     target_tokens=words, ax=ax, title=f"layer {layer_index}, head {head}")
    fig.suptitle(f"{text!r}  p(positive) = {prob[b]:.2f}", fontsize=10)
    fig.tight_layout()
    plt.show()

# %% [markdown]
# What to look at: rows are the attending word, columns the word attended to; the padding
# columns are absent (masked), and words outside the 3000-word vocabulary are dropped by the
# tokenizer. Each panel has its own colour scale (see its bar): a panel that looks uniformly bright
# is a head that spreads its weight evenly over the sentence. In this run the first layer's heads
# mostly average the whole sentence (with a preference for its last words), while the second
# layer's heads concentrate on a few columns that every row then reads. Those columns are not
# necessarily the sentiment words: after layer 0 every position already mixes the whole
# sentence, and the classifier averages all positions anyway. Nothing forces a head to be
# interpretable; treat these pictures as hints, not explanations.
