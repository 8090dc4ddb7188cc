# %% [markdown]
# # Attention, step by step
#
# This notebook walks through the attention mechanism of Bahdanau et al. (2015) and Luong et al.
# (2015) on a tiny example you can check by hand: three encoder states, one decoder state, a
# small feed-forward alignment model. Every number is computed twice, once with attnx (whose math
# runs in C++) and once with plain NumPy, and the notebook asserts that both agree.
#
# If you know Keras: attnx layers are called like Keras layers (`layer(x)` or
# `layer([query, value])`), their weights are NumPy arrays in `layer.params`, and
# `return_attention_scores=True` also returns the attention weights.
#
# Contents
# 1. the worked example: scores $e_{ij}$, weights $\alpha_{ij}$, context $c_i$
# 2. one decoder step that uses the context
# 3. a whole target sequence at once, as a heatmap
# 4. the dot, general, concat and additive scores side by side
# 5. local attention: the local-m and local-p windows

# %%
import os

import matplotlib.pyplot as plt
import numpy as np

import attnx
from attnx import layers
from attnx.layers.attention import masked_softmax, softmax_context

QUICK = os.environ.get("ATTNX_QUICK") == "1"  # the test suite sets this; nothing here is slow anyway
attnx.set_random_seed(0)
rng = np.random.default_rng(0)
np.set_printoptions(precision=4, suppress=True)

# %% [markdown]
# ## 1. The worked example
#
# An encoder (an RNN, say) has read a three-word source sentence and produced one hidden state per
# word, the *annotations* $h_1, h_2, h_3 \in \mathbb{R}^4$. The decoder is about to produce target
# word $i$; its previous hidden state is $s_{i-1} \in \mathbb{R}^4$.
#
# We make them up (batch of one, so the arrays have a leading axis of size 1, attnx's
# batch-first `(batch, time, features)` layout):

# %%
h = rng.normal(size=(1, 3, 4)).astype(np.float32)   # encoder states h_1..h_3: (batch, S=3, 4)
s_prev = rng.normal(size=(1, 4)).astype(np.float32)  # decoder state s_{i-1}: (batch, 4)
print("h =\n", h[0])
print("s_{i-1} =", s_prev[0])

# %% [markdown]
# ### Scores from an alignment model
#
# Bahdanau's *alignment model* is a one-hidden-layer feed-forward network that scores how well
# the input around position $j$ matches the output at position $i$:
#
# $$e_{ij} = a(s_{i-1}, h_j) = v_a^\top \tanh(W_a s_{i-1} + U_a h_j + b_a)$$
#
# In attnx this is `Attention(score="additive")` (also available as `AdditiveAttention`). Its
# weights are `query_kernel` ($W_a$), `key_kernel` ($U_a$), `bias` ($b_a$) and `v` ($v_a$); we
# use 5 hidden units. `build` creates the weights from the input shapes (calling the layer would
# too); they are plain NumPy arrays we can overwrite in place:

# %%
additive = layers.Attention(score="additive", units=5)
additive.build([s_prev.shape, h.shape])
additive.params["v"][:] = rng.normal(size=(5, 1))  # a larger v than the default init: sharper weights
context, weights = additive([s_prev, h], return_attention_scores=True)
for name, w in additive.params.items():
    print(f"{name:13s} {w.shape}")

# %% [markdown]
# The same thing in NumPy, with the layer's weights (note the row-vector convention: $x W$ rather
# than $W x$):

# %%
W_a, U_a = additive.params["query_kernel"], additive.params["key_kernel"]
b_a, v_a = additive.params["bias"], additive.params["v"][:, 0]

e = np.array([v_a @ np.tanh(s_prev[0] @ W_a + h[0, j] @ U_a + b_a) for j in range(3)])
print("scores e_i1..e_i3:", e)

# %% [markdown]
# ### Softmax weights
#
# The scores are turned into a probability distribution over source positions:
#
# $$\alpha_{ij} = \frac{\exp(e_{ij})}{\sum_{k=1}^{3} \exp(e_{ik})}$$

# %%
alpha = np.exp(e - e.max()) / np.exp(e - e.max()).sum()
print("NumPy weights alpha:", alpha)
print("attnx weights      :", weights[0])
assert np.allclose(weights[0], alpha, atol=1e-6)

# %% [markdown]
# ### Context vector
#
# The context is the weighted sum of the annotations, a summary of the source focused where the
# weights are large:
#
# $$c_i = \sum_{j=1}^{3} \alpha_{ij} h_j$$

# %%
c = (alpha[:, None] * h[0]).sum(axis=0)
print("NumPy context:", c)
print("attnx context:", context[0])
assert np.allclose(context[0], c, atol=1e-6)

# %% [markdown]
# The last two steps (softmax over the source, weighted sum) are the same for every kind of
# attention, so attnx also exposes them as functions on NumPy arrays: `masked_softmax(scores)`
# and `softmax_context(scores, value)` take scores shaped `(batch, queries, source)`. A boolean
# mask (True = may attend, as in Keras) removes positions, e.g. padding:

# %%
ctx_f, w_f = softmax_context(e[None, None, :].astype(np.float32), h)
assert np.allclose(w_f[0, 0], alpha, atol=1e-6) and np.allclose(ctx_f[0, 0], c, atol=1e-6)

mask = np.array([[True, True, False]])  # pretend h_3 is padding
w_masked = masked_softmax(e[None, None, :].astype(np.float32), mask=mask)
print("weights with h_3 masked:", w_masked[0, 0])
assert np.allclose(w_masked[0, 0, :2], np.exp(e[:2]) / np.exp(e[:2]).sum(), atol=1e-6) and w_masked[0, 0, 2] == 0

# %% [markdown]
# ## 2. One decoder step
#
# Bahdanau's decoder computes its new state from the previous one, the previous target word
# $y_{i-1}$ (embedded) and the context, then predicts the next word from state and context:
#
# $$s_i = \mathrm{GRU}\big([E y_{i-1};\, c_i],\ s_{i-1}\big), \qquad
#   p(y_i \mid \cdot) = \mathrm{softmax}\big(W_o [s_i;\, c_i] + b_o\big)$$
#
# With attnx layers: an `Embedding`, a `GRUCell` (one step of a GRU; gates r, z, n in PyTorch's
# reset-after form) and a `Dense` output layer over a 6-word target vocabulary.

# %%
vocab, emb_dim = 6, 3
embedding = layers.Embedding(vocab, emb_dim)
cell = layers.GRUCell(4)
output = layers.Dense(vocab, activation="softmax")

y_prev = np.array([2])                                   # id of the previous target word
x = np.concatenate([embedding(y_prev), context], axis=-1)  # [E y_{i-1}; c_i]: (1, 3 + 4)
s_new = cell(x, [s_prev])
probs = output(np.concatenate([s_new, context], axis=-1))
print("s_i =", s_new[0])
print("p(y_i) =", probs[0], " sum =", probs.sum())

# %% [markdown]
# And the same step in NumPy. The GRU kernels hold the three gates side by side (Keras layout
# `(inputs, 3 * units)`; bias row 0 is the input bias, row 1 the recurrent bias):
#
# $$r = \sigma(x W_r + b_r + s U_r + b'_r),\quad z = \sigma(x W_z + b_z + s U_z + b'_z),\quad
#   n = \tanh\big(x W_n + b_n + r \odot (s U_n + b'_n)\big),\quad s_i = (1 - z) \odot n + z \odot s$$

# %%
def sigmoid(a):
    return 1 / (1 + np.exp(-a))


K, R, B = cell.params["kernel"], cell.params["recurrent_kernel"], cell.params["bias"]
xk = x[0] @ K + B[0]
sr = s_prev[0] @ R + B[1]
r = sigmoid(xk[0:4] + sr[0:4])
z = sigmoid(xk[4:8] + sr[4:8])
n = np.tanh(xk[8:12] + r * sr[8:12])
s_np = (1 - z) * n + z * s_prev[0]
logits = np.concatenate([s_np, c]) @ output.params["kernel"] + output.params["bias"]
p_np = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
assert np.allclose(s_new[0], s_np, atol=1e-5) and np.allclose(probs[0], p_np, atol=1e-5)
print("decoder step matches NumPy")

# %% [markdown]
# ## 3. Many decoder steps at once: the attention matrix
#
# During training all decoder states are known (teacher forcing), so the attention of every
# target position $i$ over every source position $j$ is one call: pass the queries as
# `(batch, T_target, features)`. The weights form a $T_\text{target} \times S$ matrix
# whose rows each sum to 1; `attnx.plot.attention_heatmap` draws it with tokens on the axes.
# (The weights here are untrained, so the pattern is arbitrary; the sentiment and translation
# notebooks show trained ones.)

# %%
s_all = rng.normal(size=(1, 4, 4)).astype(np.float32)   # four decoder states s_0..s_3
ctx_all, w_all = additive([s_all, h], return_attention_scores=True)
print("weights (T_target=4, S=3):\n", w_all[0], "\nrow sums:", w_all[0].sum(axis=1))

e_all = np.tanh(s_all[0][:, None, :] @ W_a + (h[0] @ U_a)[None] + b_a) @ v_a      # (4, 3)
a_all = np.exp(e_all) / np.exp(e_all).sum(axis=1, keepdims=True)
assert np.allclose(w_all[0], a_all, atol=1e-6) and np.allclose(ctx_all[0], a_all @ h[0], atol=1e-6)

attnx.plot.attention_heatmap(w_all[0], source_tokens=["h1", "h2", "h3"],
                             target_tokens=["s0", "s1", "s2", "s3"], title="additive attention weights")
plt.show()

# %% [markdown]
# ## 4. Four score functions side by side
#
# Only the score $e_{ij} = \mathrm{score}(s, h_j)$ changes between the classic variants; softmax and
# context stay the same. Luong et al. (2015) list
#
# | name | score | attnx |
# |---|---|---|
# | dot | $s^\top h_j$ | `Attention(score="dot")` (Keras' `Attention`) |
# | general | $s^\top W_a h_j$ | `Attention(score="general")` |
# | concat | $v_a^\top \tanh(W_a [s; h_j])$ | `Attention(score="concat")` |
# | additive (Bahdanau) | $v_a^\top \tanh(W_1 h_j + W_2 s + b)$ | `Attention(score="additive")` |
#
# (`"scaled_dot"` divides the dot score by $\sqrt{d_k}$, the transformer's choice.) attnx stores the
# concat matrix $W_a$ as a query half and a key half, $W_a[s; h_j] = W_q s + W_k h_j$, so it never
# builds the concatenations. We run all four on the same states and check each against NumPy.

# %%
def numpy_scores(layer, query, keys):
    p = layer.params
    if layer.score == "dot":
        return keys @ query
    if layer.score == "general":
        return keys @ (query @ p["kernel"])
    hidden = np.tanh(query @ p["query_kernel"] + keys @ p["key_kernel"] + p.get("bias", 0.0))
    return hidden @ p["v"][:, 0]


results = {}
for score in ["dot", "general", "concat", "additive"]:
    layer = layers.Attention(score=score)
    ctx_s, w_s = layer([s_prev, h], return_attention_scores=True)
    e_s = numpy_scores(layer, s_prev[0], h[0])
    a_s = np.exp(e_s - e_s.max()) / np.exp(e_s - e_s.max()).sum()
    assert np.allclose(w_s[0], a_s, atol=1e-5) and np.allclose(ctx_s[0], a_s @ h[0], atol=1e-5), score
    results[score] = (e_s, w_s[0])
    print(f"{score:9s} scores {e_s}  weights {w_s[0]}")

fig, axes = plt.subplots(1, 4, figsize=(12, 2.8), sharey=True)
for ax, (score, (e_s, w_s)) in zip(axes, results.items()):
    ax.bar(["h1", "h2", "h3"], w_s, color="tab:blue")
    ax.set_title(f"{score}\ne = {np.array2string(e_s, precision=2)}", fontsize=9)
    ax.set_ylim(0, 1)
axes[0].set_ylabel(r"weight $\alpha_{ij}$")
fig.tight_layout()
plt.show()

# %% [markdown]
# What to look at: each panel is a distribution over $h_1..h_3$ for the same decoder state. The
# dot score has no parameters and depends only on the geometry of the states (it needs query and
# key of the same size); the three others learn their parameters (here they are at their random
# initialization, so their preferences differ arbitrarily).

# %% [markdown]
# ## 5. Local attention: local-m and local-p
#
# Global attention looks at every source position. Luong's *local* attention first picks an
# aligned position $p_t$ and only attends to the window $[p_t - D, p_t + D]$, favouring the centre
# with a Gaussian ($\sigma = D/2$):
#
# $$a_t(s) = \mathrm{align}(h_t, \bar h_s)\, \exp\!\Big(-\frac{(s - p_t)^2}{2\sigma^2}\Big),
#   \qquad |s - p_t| \le D$$
#
# where align is the softmax of the scores over the window only. Two ways to pick $p_t$:
#
# - **local-m** (monotonic): $p_t = t$, the source and target are assumed roughly aligned;
# - **local-p** (predictive): $p_t = S \cdot \sigma(v_p^\top \tanh(W_p h_t))$, learned, with $S$ the
#   source length.
#
# As in the paper the Gaussian is applied after the softmax and not renormalized, so rows sum to
# less than 1. Here: a 20-step source, 20 decoder states and $D = 3$.

# %%
S, D = 20, 3
src = rng.normal(size=(1, S, 8)).astype(np.float32)
tgt = rng.normal(size=(1, S, 8)).astype(np.float32)

local_m = layers.LocalAttention(window=D, mode="local-m", score="general")
local_p = layers.LocalAttention(window=D, mode="local-p", score="general")
_, w_m = local_m([tgt, src], return_attention_scores=True)
_, w_p = local_p([tgt, src], return_attention_scores=True)

# NumPy check of local-m at every target step t (p_t = t)
sigma = D / 2
for t in range(S):
    win = np.arange(max(0, t - D), min(S, t + D + 1))
    e_t = src[0, win] @ (tgt[0, t] @ local_m.params["kernel"])
    align = np.exp(e_t - e_t.max()) / np.exp(e_t - e_t.max()).sum()
    expected = np.zeros(S)
    expected[win] = align * np.exp(-(win - t) ** 2 / (2 * sigma ** 2))
    assert np.allclose(w_m[0, t], expected, atol=1e-5), t

# local-p: the predicted positions, then the same window around them
P = local_p.params
p_t = S / (1 + np.exp(-(np.tanh(tgt[0] @ P["position_kernel"]) @ P["position_v"][:, 0])))
for t in range(S):
    win = np.arange(S)[np.abs(np.arange(S) - p_t[t]) <= D]
    e_t = src[0, win] @ (tgt[0, t] @ P["kernel"])
    align = np.exp(e_t - e_t.max()) / np.exp(e_t - e_t.max()).sum()
    expected = np.zeros(S)
    expected[win] = align * np.exp(-(win - p_t[t]) ** 2 / (2 * sigma ** 2))
    assert np.allclose(w_p[0, t], expected, atol=1e-5), t
print("local-m and local-p match NumPy; predicted positions p_t:", np.round(p_t, 1))

# %%
fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
attnx.plot.attention_heatmap(w_m[0], ax=axes[0], title="local-m: window around p_t = t")
attnx.plot.attention_heatmap(w_p[0], ax=axes[1], title="local-p: window around learned p_t (untrained)")
axes[1].plot(p_t, np.arange(S), "r.", label="$p_t$")
axes[1].legend(loc="lower right")
for ax in axes[:2]:
    ax.set_xlabel("source position s")
    ax.set_ylabel("target step t")
t = 10
grid = np.linspace(t - D, t + D, 100)
axes[2].plot(grid, np.exp(-(grid - t) ** 2 / (2 * sigma ** 2)), "k--", label=r"Gaussian, $\sigma = D/2$")
axes[2].bar(np.arange(S), w_m[0, t], alpha=0.7, label=f"local-m weights at t = {t}")
axes[2].set_xlabel("source position s")
axes[2].legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# What to look at: in the local-m heatmap the non-zero weights form a band of width $2D + 1 = 7$
# along the diagonal (clipped at the sentence ends); inside the band the weights follow the
# alignment scores damped by the Gaussian (right panel: the bars never exceed the dashed curve).
# In local-p the band follows the red dots, the positions the untrained position network predicts;
# training moves them to where the source words that matter are (the derivative flows through
# $p_t$ too, attnx implements it).
#
# Next: `sentiment_attention.ipynb` trains attention on real sentences, `transformer_blocks.ipynb`
# builds self-attention and multi-head attention.
