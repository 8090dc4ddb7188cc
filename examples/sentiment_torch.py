"""The sentiment model of examples/sentiment.py in PyTorch: the reference attnx's accuracy is judged by.

    python examples/sentiment_torch.py --seeds 10      # mean final validation accuracy, seeds 0..9

Same data, shuffle, split, tokenizer, padding and initial weights (copied from the attnx model
that sentiment.py builds for the seed, i.e. Keras' initializers), same protocol: Embedding(vocab, 32)
with L2 1e-3 added to the loss, LSTM(100) with one input-dropout mask (rate 0.2) per sequence as in
Keras, the tutorial's attention pooling (e = tanh(h W + b), b one per position), Dense(1, sigmoid),
Adam (epsilon 1e-7, Keras' default), binary cross-entropy, 10 epochs of batch 32 reshuffled each epoch.
"""
import argparse

import numpy as np
import torch
from torch import nn

import attnx
from sentiment import MAXLEN, load, lstm_attention_model


class TorchLSTMAttention(nn.Module):
    def __init__(self, vocab_size, dropout=0.2):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, 32)
        self.lstm = nn.LSTM(32, 100, batch_first=True)
        self.pool_kernel = nn.Parameter(torch.zeros(100, 1))
        self.pool_bias = nn.Parameter(torch.zeros(MAXLEN, 1))
        self.dense = nn.Linear(100, 1)
        self.dropout = dropout

    @torch.no_grad()
    def copy_from(self, model):
        """Weights of the attnx model (Embedding, LSTM, AttentionPooling, Dense) into this module."""
        emb, lstm, pool, dense = ({n: torch.from_numpy(p.copy()) for n, p, _ in layer.trainable_params}
                                  for layer in model.layers)
        self.embedding.weight.copy_(emb["embeddings"])
        self.lstm.weight_ih_l0.copy_(lstm["kernel"].T)  # Keras' gate order (i, f, c, o) is torch's
        self.lstm.weight_hh_l0.copy_(lstm["recurrent_kernel"].T)
        self.lstm.bias_ih_l0.copy_(lstm["bias"])
        self.lstm.bias_hh_l0.zero_()
        self.pool_kernel.copy_(pool["kernel"])
        self.pool_bias.copy_(pool["bias"])
        self.dense.weight.copy_(dense["kernel"].T)
        self.dense.bias.copy_(dense["bias"])
        return self

    def forward(self, ids):
        x = self.embedding(ids)
        if self.training and self.dropout:  # one mask per sequence, shared by every time step
            keep = torch.rand(x.shape[0], 1, x.shape[2]) >= self.dropout
            x = x * keep / (1 - self.dropout)
        h, _ = self.lstm(x)
        # e_t = tanh(h_t W + b_t); a = softmax_t(e); pooled = sum_t a_t h_t
        weights = torch.softmax(torch.tanh(h @ self.pool_kernel + self.pool_bias), dim=1)
        return self.dense((weights * h).sum(1))


def run(seed, epochs=10, data_dir=None):
    """Trains the PyTorch model for one seed; returns the validation accuracy after each epoch."""
    attnx.set_random_seed(seed)
    torch.manual_seed(seed)
    sentences, labels = load(seed, data_dir)
    tokenizer = attnx.text.Tokenizer()
    tokenizer.fit_on_texts(sentences)
    x = attnx.text.pad_sequences(tokenizer.texts_to_sequences(sentences), maxlen=MAXLEN, padding="post",
                                 truncating="post")
    attnx_model = lstm_attention_model(len(tokenizer.word_index) + 1)
    attnx_model.predict(x[:1], verbose=0)  # builds it: Keras' initial weights for this seed
    net = TorchLSTMAttention(len(tokenizer.word_index) + 1).copy_from(attnx_model)
    split = int(len(x) * 0.8)
    x_train, y_train = torch.from_numpy(x[:split]), torch.from_numpy(labels[:split])
    x_val, y_val = torch.from_numpy(x[split:]), labels[split:]
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, eps=1e-7)
    loss_fn = nn.BCEWithLogitsLoss()
    accuracies = []
    for _ in range(epochs):
        net.train()
        for idx in torch.randperm(split).split(32):
            opt.zero_grad()
            loss = loss_fn(net(x_train[idx])[:, 0], y_train[idx]) + 1e-3 * net.embedding.weight.square().sum()
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            predicted = (net(x_val)[:, 0] > 0).numpy()
        accuracies.append(float(np.mean(predicted == (y_val > 0.5))))
    return accuracies


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args()
    torch.set_num_threads(2)
    finals = []
    for seed in range(args.seed, args.seed + args.seeds):
        curve = run(seed, data_dir=args.data_dir)
        finals.append(curve[-1])
        print(f"seed {seed}: validation accuracy {curve[-1]:.4f}  (by epoch: {' '.join(f'{a:.3f}' for a in curve)})",
              flush=True)
    print(f"mean validation accuracy over {len(finals)} seeds: {np.mean(finals):.4f} "
          f"(std {np.std(finals, ddof=1) if len(finals) > 1 else 0:.4f})")


if __name__ == "__main__":
    main()
