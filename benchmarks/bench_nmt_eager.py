"""The TensorFlow NMT tutorial's GradientTape loop (examples/nmt_tutorial.py: subclassed Encoder and
Decoder, BahdanauAttention of three Dense layers, teacher forcing word by word, a padding-masked loss)
in attnx, against the same loop in PyTorch eager (nn.Module classes line for line, autograd, Adam),
and against attnx's fused `Seq2Seq` on the same batch: one training step each (an epoch is a
number of them).

    python benchmarks/run.py nmt_eager
"""
import pathlib
import statistics
import sys
import types

import numpy as np
import torch
from torch import nn

import attnx
from attnx.seq2seq import Seq2Seq
from harness import ROUND_TIME, ROUNDS, SETTLE, compare, median_time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))
import nmt_tutorial as tutorial  # noqa: E402

B, S, T, E, H, V_SRC, V_TGT = 64, 12, 12, 128, 256, 3000, 4000


class TorchEncoder(nn.Module):
    def __init__(self, vocab_size, embedding_dim, enc_units):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.gru = nn.GRU(embedding_dim, enc_units, batch_first=True)

    def forward(self, x, hidden):
        output, state = self.gru(self.embedding(x), hidden[None])
        return output, state[0]


class TorchBahdanauAttention(nn.Module):
    def __init__(self, units, query_dim, value_dim):
        super().__init__()
        self.W1, self.W2, self.V = nn.Linear(query_dim, units), nn.Linear(value_dim, units), nn.Linear(units, 1)

    def forward(self, query, values):
        score = self.V(torch.tanh(self.W1(query[:, None]) + self.W2(values)))
        attention_weights = torch.softmax(score, dim=1)
        return (attention_weights * values).sum(dim=1), attention_weights


class TorchDecoder(nn.Module):
    def __init__(self, vocab_size, embedding_dim, dec_units):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.gru = nn.GRU(embedding_dim + dec_units, dec_units, batch_first=True)
        self.fc = nn.Linear(dec_units, vocab_size)
        self.attention = TorchBahdanauAttention(dec_units, dec_units, dec_units)

    def forward(self, x, hidden, enc_output):
        context_vector, attention_weights = self.attention(hidden, enc_output)
        x = torch.cat([context_vector[:, None], self.embedding(x)], dim=-1)
        output, state = self.gru(x)  # the tutorial's decoder: its GRU starts from zeros
        return self.fc(output.reshape(-1, output.shape[2])), state[0], attention_weights


def torch_train_step(encoder, decoder, optimizer, inp, targ, start_id):
    loss_object = nn.CrossEntropyLoss(reduction="none")
    optimizer.zero_grad()
    loss = 0
    enc_output, dec_hidden = encoder(inp, torch.zeros(len(inp), H))
    dec_input = torch.full((len(inp), 1), start_id)
    for t in range(1, targ.shape[1]):
        predictions, dec_hidden, _ = decoder(dec_input, dec_hidden, enc_output)
        mask = (targ[:, t] != 0).float()
        loss = loss + (loss_object(predictions, targ[:, t]) * mask).mean()
        dec_input = targ[:, t][:, None]
    loss.backward()
    optimizer.step()
    return loss.item() / targ.shape[1]


def main():
    rng = np.random.default_rng(0)
    source = rng.integers(1, V_SRC, (B, S))
    target = rng.integers(3, V_TGT, (B, T))
    target[:, 0] = 1
    attnx.set_random_seed(0)
    encoder, decoder = tutorial.Encoder(V_SRC, E, H, B), tutorial.Decoder(V_TGT, E, H, B)
    # the tutorial's train_step reads its globals
    tutorial.encoder, tutorial.decoder, tutorial.BATCH_SIZE = encoder, decoder, B
    tutorial.optimizer = attnx.optimizers.Adam()
    tutorial.targ_lang = types.SimpleNamespace(word_index={"<start>": 1})
    step = tutorial.train_step
    hidden = encoder.initialize_hidden_state()
    torch.manual_seed(0)
    t_encoder, t_decoder = TorchEncoder(V_SRC, E, H), TorchDecoder(V_TGT, E, H)
    t_optimizer = torch.optim.Adam(list(t_encoder.parameters()) + list(t_decoder.parameters()), eps=1e-7)
    t_source, t_target = torch.from_numpy(source), torch.from_numpy(target)
    fused = Seq2Seq(V_SRC, V_TGT, embedding_dim=E, units=H, attention="bahdanau", start_token=1, end_token=2,
                    max_length=T)
    fused.compile(attnx.optimizers.Adam())
    label = f"B={B} S={S} T={T} E={E} H={H} V={V_SRC}/{V_TGT}"

    def eager():
        step(source, target, hidden)

    compare(f"NMT tutorial GradientTape step {label}", eager,
            lambda: torch_train_step(t_encoder, t_decoder, t_optimizer, t_source, t_target, 1), warmup=2, repeat=9)
    # the eager loop against attnx's fused model, interleaved the same way
    eager_times, fused_times = [], []
    for r in range(ROUNDS):
        order = [(eager, eager_times), (lambda: fused.train_on_batch(source, target), fused_times)]
        for fn, times in (order if r % 2 == 0 else order[::-1]):
            times.append(median_time(fn, 1, 2, ROUND_TIME, SETTLE))
    ratios = [e / f for e, f in zip(eager_times, fused_times)]
    print(f"{'NMT tutorial GradientTape step vs fused Seq2Seq':<48s} eager {statistics.median(eager_times) * 1e3:9.3f} ms"
          f"   fused {statistics.median(fused_times) * 1e3:9.3f} ms   eager/fused {statistics.median(ratios):5.2f}x "
          f"({min(ratios):.2f}-{max(ratios):.2f}, {ROUNDS} rounds)", flush=True)


if __name__ == "__main__":
    from harness import setup_threads
    print(f"threads: {setup_threads()} (attnx and torch)")
    main()
