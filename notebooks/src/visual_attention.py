# %% [markdown]
# # Visual attention: captioning images with Show, Attend and Tell
#
# Xu et al. (2015), "Show, Attend and Tell": an encoder turns an image into $L$ annotation vectors
# $a_1 \dots a_L$ of size $D$, one per region, and an LSTM decoder writes the caption word by word,
# looking at the regions through attention. Where it looks for each word is the picture everyone
# remembers from the paper; here we draw it on images of handwritten digits, captioned with the
# digits' names from left to right ("seven two nine"), and compare soft attention (a weighted
# average of the regions) with hard attention (one region per word, learned by REINFORCE).
#
# `attnx.vision.ImageCaptioner` is the paper's decoder on attnx's fused Bahdanau decoder (every
# teacher-forced step in one C++ call, forward and backward). It is an attnx `Model`: `compile`,
# `fit`, `save` / `attnx.load_model`, plus `caption`, `greedy_caption` and `beam_caption`, which
# return the attention over the regions for every word.

# %%
import os
import time

import matplotlib.pyplot as plt
import numpy as np
from IPython import get_ipython

import attnx
from attnx import layers
from attnx.vision import ImageCaptioner

# ATTNX_QUICK=1 (set by the test suite): a few hundred images and one epoch, to check that the
# notebook runs. The full run trains each captioner for a few minutes on a 2-core CPU.
QUICK = os.environ.get("ATTNX_QUICK") == "1"
N_TRAIN, N_TEST = (300, 100) if QUICK else (6000, 1000)
SOFT_EPOCHS, HARD_EPOCHS = (1, 1) if QUICK else (12, 24)
CANVAS = (16, 48)
attnx.set_random_seed(0)
get_ipython().run_line_magic("matplotlib", "inline")  # the figures stay in the notebook even under MPLBACKEND=Agg

# %% [markdown]
# ## Data: composed digits, made on the fly
#
# `attnx.datasets.load_digit_captions` places three of scikit-learn's 8x8 handwritten digits at
# random on a 16x48 canvas, left to right, and captions them with their names. It also returns
# each digit's box, so we can check where the model looks. Nothing is downloaded, and a seed gives
# the same data every time: the test images (seed 1) are compositions the model never saw, and
# training draws new ones every epoch.

# %%
train = attnx.datasets.load_digit_captions(N_TRAIN, canvas=CANVAS, seed=0)  # to look at; training draws fresh images
test = attnx.datasets.load_digit_captions(N_TEST, canvas=CANVAS, seed=1)
print("images", train.images.shape, "tokens", train.tokens.shape, "vocabulary", train.vocabulary)
fig, axes = plt.subplots(1, 4, figsize=(12, 1.6))
for ax, image, caption, boxes in zip(axes, train.images, train.captions, train.boxes):
    ax.imshow(image[..., 0], cmap="gray")
    for top, left, bottom, right in boxes:
        ax.add_patch(plt.Rectangle((left - 0.5, top - 0.5), right - left, bottom - top, fill=False, color="tab:red"))
    ax.set_title(caption)
    ax.axis("off")
plt.show()

# %% [markdown]
# ## The encoder: a small CNN, one annotation per region
#
# The paper's encoder is a CNN whose last feature map (14 x 14 x 512) becomes $L = 196$ annotations.
# Ours is a small one: a convolution with 8x8 kernels (a digit's size) every 2 pixels, then a 3x3
# max pooling every 2, which leaves a 2 x 10 feature map: each of its cells sees 12x12 pixels, every
# 4 pixels, and answers to a digit anywhere inside them. `Reshape` turns the map into $L = 20$
# regions, a Dense layer makes $D = 64$ features, and a learned embedding of each region's place is
# added (a deep CNN's features carry where they are through their padding; ours need it to go from
# left to right). Any attnx layer or model that maps images to $(B, L, D)$ can be the encoder.

# %%
GRID = (2, 10)         # the feature map: rows x columns of regions
REGION, STRIDE = 12, 4  # the pixels a region sees, and the step between regions


def make_encoder():
    x = attnx.Input(CANVAS + (1,))
    h = layers.Conv2D(256, 8, strides=2, activation="relu", kernel_initializer="he_uniform")(x)  # 5 x 21
    h = layers.MaxPooling2D(3, strides=2)(h)                                                     # 2 x 10
    h = layers.Dense(64, activation="relu")(layers.Reshape((GRID[0] * GRID[1], 256))(h))
    return attnx.Model(x, layers.PositionEmbedding(GRID[0] * GRID[1])(h))


make_encoder().summary()

# %% [markdown]
# ## The decoder
#
# With $\bar a = \frac1L \sum_i a_i$ the mean annotation, one step $t$ (previous word $y_{t-1}$):
#
# $$h_0 = \tanh(\bar a W_h + b_h), \quad c_0 = \tanh(\bar a W_c + b_c)$$
# $$e_{ti} = v^\top \tanh(W_q h_{t-1} + W_k a_i), \quad \alpha_t = \mathrm{softmax}(e_t)$$
# $$z_t = \beta_t \sum_i \alpha_{ti} a_i, \quad \beta_t = \sigma(w_\beta^\top h_{t-1} + b_\beta)$$
# $$h_t, c_t = \mathrm{LSTM}([E y_{t-1}; z_t], h_{t-1}, c_{t-1}), \quad p(y_t) = \mathrm{softmax}(W_o h_t + b_o)$$
#
# The loss adds the paper's *doubly stochastic* regularization $\lambda \sum_i (1 - \sum_t \alpha_{ti})^2$,
# which asks every region to get about the same attention over the whole caption (the model's second
# output is the attention weights, and this term is their loss). With **hard** attention, $z_t$ is
# $\beta_t a_{s_t}$ for one region $s_t$ drawn from $\alpha_t$; the gradient cannot go through the
# draw, so the score learns by REINFORCE: $-(R - b)\, \nabla \log \alpha_{t s_t}$ with $R$ the log
# likelihood of the caption and $b$ a moving average of it.

# %%
def make_captioner(attention, **options):
    model = ImageCaptioner(make_encoder(), CANVAS + (1,), vocabulary=train.vocabulary, embedding_dim=32, units=128,
                           attention=attention, attention_regularization=1.0, max_length=5, **options)
    model.compile(optimizer=attnx.optimizers.Adam(3e-3))
    return model


def fresh_compositions(batch_size=64):
    """Batches of new images forever: compositions are free, so every epoch sees images it never saw."""
    seed = 100
    while True:
        data = attnx.datasets.load_digit_captions(N_TRAIN, canvas=CANVAS, seed=seed)
        for lo in range(0, N_TRAIN, batch_size):
            yield data.images[lo:lo + batch_size], data.tokens[lo:lo + batch_size]
        seed += 1


def decay_after(epochs):
    """Keeps the learning rate for `epochs` epochs, then multiplies it by 0.6 every epoch."""
    return attnx.callbacks.LearningRateScheduler(lambda epoch, lr: lr if epoch < epochs else lr * 0.6)


STEPS = -(-N_TRAIN // 64)
soft = make_captioner("soft")
start = time.time()
soft_history = soft.fit(fresh_compositions(), steps_per_epoch=STEPS, epochs=SOFT_EPOCHS, verbose=0,
                        callbacks=[decay_after(8)])
print(f"soft attention: {SOFT_EPOCHS} epochs in {time.time() - start:.0f} s")


# %% [markdown]
# ## How good are the captions, and does the model look at the right digit?
#
# A caption is exact when all three words are right. For each word we take the region with the
# largest attention weight and ask which digit's box overlaps that region's window most: it should
# be the digit the word names.

# %%
def report(model, name):
    tokens, attention = model.greedy_caption(test.images)
    n = min(tokens.shape[1], 4)
    exact = (tokens[:, :n] == test.tokens[:, 1:n + 1]).all(1).mean() if n == 4 else 0.0
    words = min(attention.shape[1], 3)
    on_digit = (attnx.datasets.attended_box(attention[:, :words], test.boxes, GRID, REGION, STRIDE)
                == np.arange(words)).mean()
    print(f"{name}: exact captions {exact:.1%}, words whose most-attended region is their digit {on_digit:.1%}")
    return exact, on_digit


report(soft, "soft attention")
attnx.plot.plot_history(soft_history, metrics=("loss",))
plt.show()

# %% [markdown]
# ## Where the model looks, word by word
#
# `model.caption(images)` returns, for each image, the words and one row of attention over the 20
# regions per word; `attnx.plot.attention_over_image` stretches each row over the image (red:
# most attention). The attention moves from left to right, one digit per word.

# %%
for image, (words, weights) in zip(test.images[:3], soft.caption(test.images[:3])):
    attnx.plot.attention_over_image(image, weights, words, grid_shape=GRID)
    plt.show()

# %% [markdown]
# Beam search gives the same captions here (the task has little ambiguity), with the attention of
# every word of every hypothesis:

# %%
for hypotheses in soft.beam_caption(test.images[:3], width=3):
    best = hypotheses[0]
    print(" ".join(train.vocabulary[t] for t in best.tokens), f"(log p = {best.score:.3f})")

# %% [markdown]
# ## Hard attention
#
# The same model with `attention="hard"`: during training each word looks at one region drawn
# from $\alpha_t$; at inference, at the most likely region. Learning where to look from a reward
# is slower than following a gradient. The paper reduces the variance of REINFORCE by using the
# expected context instead of a drawn region in half of the training steps (`soft_fraction=0.5`,
# the default); on our CPU budget we use it in three quarters of them, and train twice as long.

# %%
attnx.set_random_seed(0)
hard = make_captioner("hard", soft_fraction=0.75)
start = time.time()
hard_history = hard.fit(fresh_compositions(), steps_per_epoch=STEPS, epochs=HARD_EPOCHS, verbose=0,
                        callbacks=[decay_after(HARD_EPOCHS - 4)])
print(f"hard attention: {HARD_EPOCHS} epochs in {time.time() - start:.0f} s")
report(soft, "soft attention")
report(hard, "hard attention")

# %% [markdown]
# Soft against hard on the same images, word by word. At inference the hard captioner reads only
# its most likely region, so a word is right only if that one region holds the digit; the soft
# captioner reads the weighted average and can still be right with the weight spread over
# neighbouring regions.

# %%
images = test.images[3:5]
for image, (soft_words, soft_weights), (hard_words, hard_weights) in zip(images, soft.caption(images),
                                                                         hard.caption(images)):
    fig, axes = plt.subplots(2, max(len(soft_words), len(hard_words), 1), figsize=(10, 3.2), squeeze=False)
    attnx.plot.attention_over_image(image, soft_weights, [f"soft: {w}" for w in soft_words], GRID, axes=axes[0])
    attnx.plot.attention_over_image(image, hard_weights, [f"hard: {w}" for w in hard_words], GRID, axes=axes[1])
    plt.show()

# %% [markdown]
# ## Save and load
#
# A captioner is saved with its encoder and reads back with the same captions.

# %%
soft.save("visual_attention_soft.attnx")
loaded = attnx.load_model("visual_attention_soft.attnx")
assert (loaded.greedy_caption(test.images[:50])[0] == soft.greedy_caption(test.images[:50])[0]).all()
os.remove("visual_attention_soft.attnx")
print("saved and loaded: same captions")
