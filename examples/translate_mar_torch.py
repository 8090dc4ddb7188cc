"""English -> Marathi with the same Bahdanau model in PyTorch (baseline of examples/translate_mar.py).

    python examples/translate_mar_torch.py [--minutes 6] [--units 256] [--embedding-dim 128]

Same data, split, tokenizers, initial weights (copied from a fresh attnx model), optimizer (Adam,
epsilon 1e-7), batches and wall time as translate_mar.py; prints the test BLEU-4 of greedy decoding.
PyTorch has no attention decoder, so the decoder is a loop over target steps (as in the PyTorch
tutorials); the vocabulary projection runs once over all steps.
"""
import time

import numpy as np
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import attnx
from translate_mar import arguments, prepare


class TorchBahdanauSeq2Seq(nn.Module):
    """GRU encoder + Bahdanau GRU decoder, the equations of attnx's Seq2Seq(attention="bahdanau")."""

    def __init__(self, src_vocab, tgt_vocab, embedding_dim, units, attention_units=None):
        super().__init__()
        U = attention_units or units
        self.src_embedding = nn.Embedding(src_vocab, embedding_dim)
        self.encoder = nn.GRU(embedding_dim, units, batch_first=True)
        self.tgt_embedding = nn.Embedding(tgt_vocab, embedding_dim)
        self.key = nn.Linear(units, U, bias=False)
        self.query = nn.Linear(units, U)
        self.score = nn.Linear(U, 1, bias=False)
        self.cell = nn.GRUCell(embedding_dim + units, units)
        self.out = nn.Linear(units, tgt_vocab)

    @torch.no_grad()
    def copy_from(self, model):
        """Weights of an attnx Seq2Seq (Bahdanau, GRU, unidirectional) into this module."""
        p = {k: torch.from_numpy(v.copy()) for k, v in model.params.items()}
        self.src_embedding.weight.copy_(p["encoder/embedding/embeddings"])
        self.encoder.weight_ih_l0.copy_(p["encoder/rnn/kernel"].T)
        self.encoder.weight_hh_l0.copy_(p["encoder/rnn/recurrent_kernel"].T)
        self.encoder.bias_ih_l0.copy_(p["encoder/rnn/bias"][0])
        self.encoder.bias_hh_l0.copy_(p["encoder/rnn/bias"][1])
        self.tgt_embedding.weight.copy_(p["decoder/embeddings"])
        self.cell.weight_ih.copy_(p["decoder/kernel"].T)
        self.cell.weight_hh.copy_(p["decoder/recurrent_kernel"].T)
        self.cell.bias_ih.copy_(p["decoder/bias"][0])
        self.cell.bias_hh.copy_(p["decoder/bias"][1])
        self.query.weight.copy_(p["decoder/query_kernel"].T)
        self.query.bias.copy_(p["decoder/query_bias"])
        self.key.weight.copy_(p["decoder/key_kernel"].T)
        self.score.weight.copy_(p["decoder/score_vector"][None, :])
        self.out.weight.copy_(p["decoder/output_kernel"].T)
        self.out.bias.copy_(p["decoder/output_bias"])
        return self

    def encode(self, src):
        mask = src != 0
        packed = pack_padded_sequence(self.src_embedding(src), mask.sum(1), batch_first=True, enforce_sorted=False)
        out, h = self.encoder(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=src.shape[1])
        return out, h[0], mask, self.key(out)

    def step(self, emb, h, enc, mask, keys):
        scores = self.score(torch.tanh(self.query(h)[:, None, :] + keys)).squeeze(-1)
        weights = torch.softmax(scores.masked_fill(~mask, -torch.inf), dim=-1)
        context = torch.bmm(weights[:, None, :], enc)[:, 0]
        return self.cell(torch.cat([emb, context], dim=1), h), weights

    def forward(self, src, tgt_in):
        enc, h, mask, keys = self.encode(src)
        emb = self.tgt_embedding(tgt_in)
        states = []
        for t in range(tgt_in.shape[1]):
            h, _ = self.step(emb[:, t], h, enc, mask, keys)
            states.append(h)
        return self.out(torch.stack(states, dim=1))

    @torch.no_grad()
    def greedy(self, src, start_id, end_id, max_length):
        enc, h, mask, keys = self.encode(src)
        prev = torch.full((src.shape[0],), start_id, dtype=torch.long)
        done = torch.zeros(src.shape[0], dtype=torch.bool)
        tokens = []
        for _ in range(max_length):
            h, _ = self.step(self.tgt_embedding(prev), h, enc, mask, keys)
            prev = torch.where(done, 0, self.out(h).argmax(-1))
            tokens.append(prev)
            done |= prev == end_id
            if done.all():
                break
        return torch.stack(tokens, dim=1)


def train_step(net, opt, loss_fn, src, tgt):
    opt.zero_grad()
    logits = net(src, tgt[:, :-1])
    loss = loss_fn(logits.reshape(-1, logits.shape[-1]), tgt[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    return loss.item()


def main():
    args = arguments(__doc__.splitlines()[0])
    torch.set_num_threads(args.threads)
    splits, model = prepare(args)
    net = TorchBahdanauSeq2Seq(model.encoder.vocab_size, model.decoder.vocab_size, args.embedding_dim,
                               args.units).copy_from(model)
    opt = torch.optim.Adam(net.parameters(), lr=args.learning_rate, eps=1e-7)
    loss_fn = nn.CrossEntropyLoss(ignore_index=0)
    source, target = model.encode_sources(splits.train.source), model.encode_targets(splits.train.target)
    rng = np.random.default_rng(args.seed)  # the same batches as Seq2Seq.fit
    start, epochs = time.perf_counter(), 0
    while time.perf_counter() - start < 60 * args.minutes:
        order, losses = rng.permutation(len(source)), []
        for lo in range(0, len(order), args.batch_size):
            s, t = source[order[lo:lo + args.batch_size]], target[order[lo:lo + args.batch_size]]
            s, t = s[:, :max(1, int((s != 0).sum(1).max()))], t[:, :int((t != 0).sum(1).max())]
            losses.append(train_step(net, opt, loss_fn, torch.from_numpy(s), torch.from_numpy(t)))
            if time.perf_counter() - start > 60 * args.minutes:
                break
        epochs += 1
        print(f"epoch {epochs} loss {np.mean(losses):.4f} ({time.perf_counter() - start:.0f} s)", flush=True)
    trained = time.perf_counter() - start
    hyps = []
    for lo in range(0, len(splits.test.source), 64):
        src = torch.from_numpy(model.encode_sources(splits.test.source[lo:lo + 64]))
        for row in net.greedy(src, model.start_id, model.end_id, model.max_length).tolist():
            row = row[:row.index(model.end_id)] if model.end_id in row else row
            hyps.append(model.target_words([t for t in row if t]))
    refs = [[[w for w in r.split() if w not in ("<start>", "<end>")]] for r in splits.test.target]
    bleu = attnx.metrics.corpus_bleu(refs, hyps)
    print(f"torch: trained {trained:.0f} s, {epochs} epochs; test BLEU-4 {100 * bleu:.2f}")
    return bleu


if __name__ == "__main__":
    main()
