"""Translation quality at equal training time on the English -> Marathi pairs (issue 42).

    python benchmarks/translation_quality.py [--minutes 20] [--models transformer,seq2seq,torch] [--data PATH]
    python benchmarks/translation_quality.py --models transformer,transformer_bf16   # issue 40's comparison

Three models, trained one after the other for the same wall time each (validation included), each in a
fresh process, on the same data, batches and subword vocabulary:

- attnx `Transformer`: D 256, 4 heads, 3 + 3 layers, feed-forward 1024, dropout 0.1, pre-norm,
  shared embeddings, label smoothing 0.1, Adam (0.9, 0.98, 1e-9) on NoamDecay peaking at the
  paper's rate (D * 4000) ** -0.5 after `--warmup-steps`;
- attnx Bahdanau `Seq2Seq` (GRU, embedding 256, 256 units) with its own recipe (Adam 1e-3);
- ``transformer_bf16`` (not in the default list): the same attnx `Transformer` and recipe under the
  ``mixed_bfloat16`` policy (float32 master weights, bf16 operands in every product);
- a PyTorch ``nn.Transformer`` of the attnx Transformer's size with its recipe (the same
  embedding scale, sinusoids, final norms, loss, optimizer and schedule), trained on the same batches.

Data: `load_anki_pairs(max_words=10, split=(0.8, 0.1, 0.1), seed=0, raw=True)`: the sentences as
written. One shared SentencePiece BPE vocabulary (`attnx.text.SubwordTokenizer`) learned on the
training split serves all three. Batches of `--batch-size` pairs of similar lengths
(`attnx.translation.LengthBuckets`, the same order for the three). Every `--eval-steps` steps the
loss on the first `--val-pairs` validation pairs is computed and the weights with the best one are
kept (the best validation checkpoint), which are then scored: cased sacreBLEU on the detokenized
translations of the test split against the raw references (`attnx.translation.translation_bleu`),
greedy, and beam 4 (length penalty 0.6) for the attnx models. `--threads` (default 2) for attnx
and torch alike (`--torch-threads` sets torch's apart).
"""
import argparse
import copy
import json
import math
import os
import platform
import subprocess
import sys
import time

import numpy as np

import attnx
from attnx import optimizers
from attnx.seq2seq import Seq2Seq, Transformer
from attnx.translation import LengthBuckets, subword_tokenizers, translation_bleu

D, HEADS, LAYERS, FF, DROPOUT, PAPER_WARMUP = 256, 4, 3, 1024, 0.1, 4000
MAX_LENGTH = 40


def schedule(warmup_steps):
    """NoamDecay peaking at the paper's rate whatever the warm-up (Transformer.compile's 'auto' rule)."""
    return optimizers.NoamDecay(D, warmup_steps, math.sqrt(warmup_steps / PAPER_WARMUP))


class BestValidation(attnx.callbacks.Callback):
    """Stops after the batch that crosses the time budget; after each validation keeps the weights
    with the lowest validation loss."""

    def __init__(self, seconds):
        super().__init__()
        self.seconds, self.best, self.best_loss, self.steps = seconds, None, math.inf, 0

    def on_train_begin(self, logs=None):
        self.deadline = time.perf_counter() + self.seconds

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if time.perf_counter() > self.deadline:
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        if logs and logs.get("val_loss", math.inf) < self.best_loss:
            self.best_loss, self.best = logs["val_loss"], self.model.get_weights()


def train_attnx(model, splits, args, optimizer):
    model.compile(optimizer)
    batches = LengthBuckets(model.encode_sources(splits.train.source), model.encode_targets(splits.train.target),
                            args.batch_size)
    val = (model.encode_sources(splits.val.source[:args.val_pairs]),
           model.encode_targets(splits.val.target[:args.val_pairs]))
    keeper = BestValidation(60 * args.minutes)
    attnx.set_random_seed(args.seed)
    start = time.perf_counter()
    # an "epoch" is eval_steps batches: the validation loss is computed that often
    model.fit(batches, epochs=10 ** 6, steps_per_epoch=args.eval_steps, validation_data=val, verbose=0,
              callbacks=[keeper])
    seconds = time.perf_counter() - start
    if keeper.best is not None:
        model.set_weights(keeper.best)
    if args.save_dir:
        os.makedirs(args.save_dir, exist_ok=True)
        model.save(os.path.join(args.save_dir, f"{args.models}.attnx"))  # a child trains one model
    return {"train_seconds": seconds, "steps": keeper.steps, "best_val_loss": keeper.best_loss}


def score_attnx(model, splits, args, widths):
    source, target = splits.test.source[:args.test_pairs], splits.test.target[:args.test_pairs]
    result = {}
    for width in widths:
        start = time.perf_counter()
        bleu = model.evaluate_bleu(source, target, width=width, length_penalty=0.6, scorer="sacrebleu")
        result[f"bleu_width{width}"] = round(100 * bleu, 2)
        result[f"decode_seconds_width{width}"] = round(time.perf_counter() - start, 1)
        result["signature"] = bleu.signature
    result["examples"] = [[s, model.translate(s)[0]] for s in source[:3]]
    return result


# ----------------------------------------------------------------------------- PyTorch
def torch_model(torch, vocab_size):
    nn = torch.nn

    class TorchTransformer(nn.Module):
        """nn.Transformer with attnx's Transformer around it: one shared embedding table (std D^-1/2,
        times sqrt(D)), sinusoidal positions, dropout, nn.Transformer's final norms, a linear output."""

        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(vocab_size, D)
            nn.init.normal_(self.embedding.weight, std=D ** -0.5)
            self.transformer = nn.Transformer(D, HEADS, LAYERS, LAYERS, FF, DROPOUT, batch_first=True,
                                              norm_first=True)
            self.dropout = nn.Dropout(DROPOUT)
            self.output = nn.Linear(D, vocab_size)
            position = np.arange(512)[:, None] / 10000 ** (np.arange(0, D, 2)[None, :] / D)
            table = np.zeros((512, D), dtype=np.float32)
            table[:, 0::2], table[:, 1::2] = np.sin(position), np.cos(position)
            self.register_buffer("positions", torch.from_numpy(table))

        def embed(self, ids):
            return self.dropout(self.embedding(ids) * math.sqrt(D) + self.positions[:ids.shape[1]])

        def encode(self, source):
            return self.transformer.encoder(self.embed(source), src_key_padding_mask=source == 0)

        def decode(self, target_in, memory, source):
            mask = self.transformer.generate_square_subsequent_mask(target_in.shape[1])
            h = self.transformer.decoder(self.embed(target_in), memory, tgt_mask=mask, tgt_is_causal=True,
                                         memory_key_padding_mask=source == 0)
            return self.output(h)

        def forward(self, source, target_in):
            return self.decode(target_in, self.encode(source), source)

    return TorchTransformer()


def train_torch(torch, model, tokenized, args):
    train_source, train_target, val_source, val_target = tokenized
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    rate = schedule(args.warmup_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: rate(step))
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=0, label_smoothing=0.1)

    def trimmed(ids):
        ids = ids[:, :np.flatnonzero((ids != 0).any(axis=0))[-1] + 1]
        return torch.from_numpy(ids.astype(np.int64))

    def loss_of(source, target):
        source, target = trimmed(source), trimmed(target)
        logits = model(source, target[:, :-1])
        return loss_fn(logits.reshape(-1, logits.shape[-1]), target[:, 1:].reshape(-1))

    def validation_loss():
        model.eval()
        total = count = 0.0
        with torch.no_grad():
            for lo in range(0, len(val_source), 128):
                tokens = float((val_target[lo:lo + 128, 1:] != 0).sum())
                total += float(loss_of(val_source[lo:lo + 128], val_target[lo:lo + 128])) * tokens
                count += tokens
        model.train()
        return total / count

    attnx.set_random_seed(args.seed)  # the same batches as attnx's models
    batches = LengthBuckets(train_source, train_target, args.batch_size)
    best, best_loss, steps = None, math.inf, 0
    start = time.perf_counter()
    deadline = start + 60 * args.minutes
    model.train()
    done = False
    while not done:
        for source, target in batches:
            loss = loss_of(source, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            steps += 1
            done = time.perf_counter() > deadline
            if steps % args.eval_steps == 0 or done:
                val = validation_loss()
                if val < best_loss:
                    best, best_loss = copy.deepcopy(model.state_dict()), val
            if done:
                break
    seconds = time.perf_counter() - start
    model.load_state_dict(best)
    return {"train_seconds": seconds, "steps": steps, "best_val_loss": best_loss}


def score_torch(torch, model, tokenizer, splits, args):
    """Greedy decoding (the whole decoder re-run on the prefix at each step), cased sacreBLEU."""
    source_text, target_text = splits.test.source[:args.test_pairs], splits.test.target[:args.test_pairs]
    model.eval()
    start_id, end_id = tokenizer.word_index["<start>"], tokenizer.word_index["<end>"]
    encoded = [tokenizer.encode(s)[:1024] for s in source_text]
    order = np.argsort([len(e) for e in encoded], kind="stable")
    translations = [None] * len(encoded)
    start = time.perf_counter()
    with torch.no_grad():
        for lo in range(0, len(order), 64):
            rows = order[lo:lo + 64]
            source = torch.from_numpy(attnx.text.pad_sequences([encoded[r] for r in rows], padding="post")
                                      .astype(np.int64))
            memory = model.encode(source)
            out = torch.full((len(rows), 1), start_id, dtype=torch.int64)
            finished = torch.zeros(len(rows), dtype=torch.bool)
            for _ in range(MAX_LENGTH):
                next_ids = model.decode(out, memory, source)[:, -1].argmax(-1)
                next_ids[finished] = 0
                out = torch.cat([out, next_ids[:, None]], dim=1)
                finished |= next_ids == end_id
                if finished.all():
                    break
            for r, row in zip(rows, out[:, 1:].tolist()):
                row = row[:row.index(end_id)] if end_id in row else row
                translations[r] = tokenizer.decode([t for t in row if t])
    seconds = time.perf_counter() - start
    bleu = translation_bleu(translations, target_text, scorer="sacrebleu")
    return {"bleu_width1": round(100 * bleu, 2), "decode_seconds_width1": round(seconds, 1),
            "signature": bleu.signature, "examples": [[s, t] for s, t in zip(source_text[:3], translations[:3])]}


def train_in_own_processes(models):
    """Runs this script once per model and gathers their results. Trained after the attnx models in
    their process, PyTorch made 236 steps in 20 minutes (5.1 s each) where its step alone takes 1.45 s
    on the same host; a fresh process per model keeps one library's thread pools off another's cores."""
    results = {}
    for name in models:
        child = subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--models", name, "--child"],
                                 stdout=subprocess.PIPE, text=True)
        for line in child.stdout:
            print(line, end="", flush=True)
            if line.startswith("{"):
                results.update(json.loads(line))
        if child.wait():
            raise SystemExit(f"training {name} failed (exit status {child.returncode})")
    return results


def train_and_score(name, args):
    """Trains and scores one model (`name` of --models) in this process."""
    attnx.set_num_threads(args.threads)
    path = args.data or os.path.join(os.environ.get("ATTNX_DATA_DIR", "../shared/data"), "anki", "mar.txt")
    splits = attnx.datasets.load_anki_pairs(path=path, max_words=10, split=(0.8, 0.1, 0.1), seed=args.seed, raw=True)
    start = time.perf_counter()
    tokenizer, _ = subword_tokenizers(splits.train.source, splits.train.target, args.vocab_size, True)
    V = tokenizer.vocab_size
    print(f"pairs: train {len(splits.train.source)}, val {len(splits.val.source)} ({args.val_pairs} for the "
          f"checkpoint), test {len(splits.test.source)}; shared SentencePiece BPE of {V} ids learned in "
          f"{time.perf_counter() - start:.1f} s; {args.minutes:g} min of training each, {args.threads} threads, "
          f"batches of {args.batch_size}; {platform.processor() or platform.machine()}, "
          f"load average {os.getloadavg()[0]:.1f} at the start", flush=True)
    results = {}
    models = [name]
    for transformer, policy in (("transformer", "float32"), ("transformer_bf16", "mixed_bfloat16")):
        if transformer not in models:
            continue
        attnx.set_random_seed(args.seed)
        model = Transformer(V, V, model_dim=D, num_heads=HEADS, intermediate_dim=FF, num_encoder_layers=LAYERS,
                            num_decoder_layers=LAYERS, dropout=DROPOUT, norm_first=True, shared_embeddings=True,
                            max_length=MAX_LENGTH, source_tokenizer=tokenizer, target_tokenizer=tokenizer,
                            dtype=policy)
        optimizer = optimizers.Adam(schedule(args.warmup_steps), beta_2=0.98, epsilon=1e-9)
        label = "attnx Transformer" + ("" if policy == "float32" else f" ({policy})")
        results[label] = {"parameters": model.count_params(), **train_attnx(model, splits, args, optimizer)}
        results[label].update(score_attnx(model, splits, args, (1, 4)))
        print(json.dumps({label: results[label]}, ensure_ascii=False), flush=True)
    if "seq2seq" in models:
        attnx.set_random_seed(args.seed)
        model = Seq2Seq(V, V, embedding_dim=256, units=256, attention="bahdanau", max_length=MAX_LENGTH,
                        source_tokenizer=tokenizer, target_tokenizer=tokenizer)
        results["attnx Bahdanau Seq2Seq"] = {"parameters": model.count_params(),
                                             **train_attnx(model, splits, args, optimizers.Adam(1e-3))}
        results["attnx Bahdanau Seq2Seq"].update(score_attnx(model, splits, args, (1, 4)))
        print(json.dumps({"attnx Bahdanau Seq2Seq": results["attnx Bahdanau Seq2Seq"]}, ensure_ascii=False),
              flush=True)
    if "torch" in models:
        import torch
        torch.set_num_threads(args.torch_threads or args.threads)
        torch.manual_seed(args.seed)
        model = torch_model(torch, V)
        encode_sources = (lambda texts: attnx.text.pad_sequences([tokenizer.encode(t) for t in texts],
                                                                 padding="post").astype(np.int64))
        start_id, end_id = tokenizer.word_index["<start>"], tokenizer.word_index["<end>"]
        encode_targets = (lambda texts: attnx.text.pad_sequences([[start_id] + tokenizer.encode(t) + [end_id]
                                                                  for t in texts], padding="post").astype(np.int64))
        tokenized = (encode_sources(splits.train.source), encode_targets(splits.train.target),
                     encode_sources(splits.val.source[:args.val_pairs]),
                     encode_targets(splits.val.target[:args.val_pairs]))
        results["PyTorch nn.Transformer"] = {"parameters": sum(p.numel() for p in model.parameters()),
                                             **train_torch(torch, model, tokenized, args)}
        results["PyTorch nn.Transformer"].update(score_torch(torch, model, tokenizer, splits, args))
        print(json.dumps({"PyTorch nn.Transformer": results["PyTorch nn.Transformer"]}, ensure_ascii=False),
              flush=True)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0, help="training wall time of each model")
    parser.add_argument("--models", default="transformer,seq2seq,torch")
    parser.add_argument("--vocab-size", type=int, default=6000, help="the shared BPE vocabulary")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--warmup-steps", type=int, default=400)
    parser.add_argument("--eval-steps", type=int, default=200, help="steps between validations")
    parser.add_argument("--val-pairs", type=int, default=1000, help="validation pairs for the checkpoint choice")
    parser.add_argument("--test-pairs", type=int, default=None, help="test pairs scored (default: all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--torch-threads", type=int, default=None,
                        help="torch's threads (default --threads; on a host loaded by other jobs torch's OpenMP "
                             "threads wait on each other, and 1 thread can be several times faster)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", default=None, help="path of mar.txt (default: $ATTNX_DATA_DIR/anki/mar.txt)")
    parser.add_argument("--save-dir", default=None,
                        help="save each attnx model's best checkpoint there as NAME.attnx (NAME of --models), e.g. "
                             "for int8_translation_bleu.py --model")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one model, no table
    args = parser.parse_args()
    models = args.models.split(",")
    results = train_in_own_processes(models) if len(models) > 1 else train_and_score(models[0], args)
    if args.child:
        return
    print(f"\n| model | parameters | steps in {args.minutes:g} min | best val loss | test BLEU greedy | beam 4 |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['parameters']:,} | {r['steps']} | {r['best_val_loss']:.3f} | {r['bleu_width1']:.2f} "
              f"| {r.get('bleu_width4', float('nan')):.2f} |")
    print(f"cased sacreBLEU on raw text: {next(iter(results.values()))['signature'] if results else ''}; "
          f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
