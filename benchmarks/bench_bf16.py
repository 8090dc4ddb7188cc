"""`mixed_bfloat16` beside float32 (issue 40), one interleaved run per row: each row's training step in
attnx float32, attnx under mixed_bfloat16, PyTorch float32 and PyTorch under
``torch.autocast("cpu", dtype=torch.bfloat16)``. Rows:

- lstm: the training step (forward, loss, backward, Adam) of bench_rnn's model (b),
  Embedding(5000, 128) -> LSTM(256) -> Dense(1), B=64, T=128;
- encoder: bench_transformer's encoder layer at T=512 (B=8, D=256, 8 heads, FF 1024, post-norm, relu,
  dropout 0.1), forward and backward of the input and every weight;
- transformer: the translation example's model, D 256, 4 heads, 3 + 3 layers, FF 1024, pre-norm, dropout
  0.1, a shared 8000-id vocabulary (shared embeddings, untied output), B=64 pairs of 24 source and 24
  target tokens: one step of the recipe (label-smoothed cross-entropy, Adam 0.9/0.98/1e-9) against
  translation_quality.py's ``nn.Transformer`` of the same size and recipe; also in target tokens/s;
- seq2seq: bench_seq2seq's Bahdanau model (GRU encoder and attention decoder, B=64, T=16, embedding 256,
  512 units, 8000-id vocabularies), one `train_on_batch` against examples/translate_mar_torch.py's
  module started from the same weights (Adam);
- fit: the main job, examples/sentiment.py's `Model.fit` for 10 epochs (LSTM(100) + AttentionPooling,
  batch 32, validation each epoch) against examples/sentiment_torch.py's loop, one seed; fewer timed
  runs per round (ATTNX_BENCH_ROUNDS rounds of one run each).

Each round times the four in a rotated order (each round's block after ATTNX_BENCH_SETTLE seconds of
untimed runs, as harness.compare does); prints each one's median time over the rounds and the ratios of
the rounds' times, median (min-max), and how many cores each keeps busy (CPU time / wall over a few calls).
Benchmarks are never tests: nothing here asserts a timing.

    python benchmarks/bench_bf16.py [lstm] [encoder] [transformer] [seq2seq] [fit]   (default: all;
        ATTNX_BENCH_THREADS, default 2; ATTNX_BENCH_ROUNDS, default 5)
"""
import os
import pathlib
import statistics
import sys
import time

import numpy as np

import bench_rnn
from harness import ROUND_TIME, ROUNDS, SETTLE, median_time, setup_threads

POLICIES = ("float32", "mixed_bfloat16")
REPO = pathlib.Path(__file__).resolve().parents[1]


def _made_under(policy, make):
    import attnx
    attnx.mixed_precision.set_global_policy(policy)
    try:
        return make()
    finally:
        attnx.mixed_precision.set_global_policy(None)


def _torch_steps(step):
    """{name: fn} of a PyTorch step in float32 and under autocast bf16."""
    import torch

    def autocast():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return step()
    return {"torch float32": step, "torch autocast bf16": autocast}


# ----------------------------------------------------------------------------- LSTM(256)
B_LSTM, T_LSTM, EMBED, UNITS = 64, 128, 128, 256


def lstm_steps():
    import torch
    steps = {}
    for policy in POLICIES:
        model = _made_under(policy, lambda: bench_rnn.AttnxModel("lstm", EMBED, UNITS))
        assert model.rnn.compute_dtype == ("bfloat16" if policy == "mixed_bfloat16" else "float32")
        ids, y = bench_rnn._data(B_LSTM, T_LSTM)
        steps[f"attnx {policy}"] = lambda model=model, ids=ids, y=y: model.train_step(ids, y)
    train, _ = bench_rnn.torch_model("lstm", EMBED, UNITS)
    ids, y = (torch.from_numpy(a) for a in bench_rnn._data(B_LSTM, T_LSTM))
    return f"LSTM(256) B={B_LSTM} T={T_LSTM} training step", steps | _torch_steps(lambda: train(ids, y)), None


# ----------------------------------------------------------------------------- encoder layer, T=512
B_ENC, T_ENC, D_ENC, HEADS_ENC, FF_ENC = 8, 512, 256, 8, 1024


def encoder_steps():
    import torch
    from attnx.interop import from_torch
    torch.manual_seed(0)
    module = torch.nn.TransformerEncoderLayer(D_ENC, HEADS_ENC, FF_ENC, dropout=0.1, batch_first=True)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B_ENC, T_ENC, D_ENC)).astype(np.float32)
    dy = rng.standard_normal((B_ENC, T_ENC, D_ENC)).astype(np.float32)
    steps = {}
    for policy in POLICIES:
        layer = from_torch(module, dtype=policy)
        assert layer.dtype_policy.name == policy

        def step(layer=layer):
            layer.zero_grad()
            layer(x, training=True)
            layer.backward(dy)
        steps[f"attnx {policy}"] = step
    tx, tdy = torch.from_numpy(x).requires_grad_(True), torch.from_numpy(dy)
    module.train()

    def torch_step():
        module.zero_grad(set_to_none=True)
        tx.grad = None
        module(tx).backward(tdy)
    tag = f"encoder layer B={B_ENC} T={T_ENC} D={D_ENC} h={HEADS_ENC} ff={FF_ENC} train step"
    return tag, steps | _torch_steps(torch_step), None


# ----------------------------------------------------------------------------- the whole Transformer
B_TR, S_TR, T_TR, VOCAB_TR = 64, 24, 24, 8000


def _translation_batch():
    """B pairs of ids in [3, V), the target starting with the start id 1 (no padding: every row full)."""
    rng = np.random.default_rng(0)
    source = rng.integers(3, VOCAB_TR, (B_TR, S_TR))
    target = rng.integers(3, VOCAB_TR, (B_TR, T_TR + 1))
    target[:, 0] = 1
    return source, target


def transformer_steps():
    import torch
    import attnx
    from attnx.seq2seq import Transformer
    from translation_quality import D, DROPOUT, FF, HEADS, LAYERS, torch_model
    source, target = _translation_batch()
    steps = {}
    for policy in POLICIES:
        attnx.set_random_seed(0)
        model = Transformer(VOCAB_TR, VOCAB_TR, model_dim=D, num_heads=HEADS, intermediate_dim=FF,
                            num_encoder_layers=LAYERS, num_decoder_layers=LAYERS, dropout=DROPOUT, norm_first=True,
                            shared_embeddings=True, start_token=1, end_token=2, dtype=policy)
        model.compile(attnx.optimizers.Adam(1e-4, beta_2=0.98, epsilon=1e-9))
        steps[f"attnx {policy}"] = lambda model=model: model.train_on_batch(source, target)
    torch.manual_seed(0)
    net = torch_model(torch, VOCAB_TR)
    net.train()
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=0, label_smoothing=0.1)
    t_source, t_target = torch.from_numpy(source), torch.from_numpy(target)

    def torch_step():
        logits = net(t_source, t_target[:, :-1])
        loss = loss_fn(logits.reshape(-1, logits.shape[-1]).float(), t_target[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    tag = (f"Transformer D{D} {LAYERS}+{LAYERS} FF{FF} V{VOCAB_TR} B={B_TR} S={S_TR} T={T_TR} training step "
           f"(train_on_batch, Adam)")
    return tag, steps | _torch_steps(torch_step), B_TR * T_TR


# ----------------------------------------------------------------------------- seq2seq Bahdanau
def seq2seq_steps():
    import torch
    import attnx
    import bench_seq2seq as s2s
    from attnx.seq2seq import Seq2Seq
    sys.path.insert(0, str(REPO / "examples"))
    from translate_mar_torch import TorchBahdanauSeq2Seq, train_step
    rng = np.random.default_rng(0)
    source = rng.integers(3, s2s.V, (s2s.B, s2s.T))
    target = np.concatenate([np.ones((s2s.B, 1), np.int64), rng.integers(3, s2s.V, (s2s.B, s2s.T))], axis=1)
    steps = {}
    for policy in POLICIES:
        attnx.set_random_seed(0)
        model = Seq2Seq(s2s.V, s2s.V, embedding_dim=s2s.E, units=s2s.H, attention="bahdanau", start_token=1,
                        end_token=2, max_length=s2s.T, dtype=policy)
        model.build(s2s.T)
        model.compile(attnx.optimizers.Adam(1e-3))
        steps[f"attnx {policy}"] = lambda model=model: model.train_on_batch(source, target)
    net = TorchBahdanauSeq2Seq(s2s.V, s2s.V, s2s.E, s2s.H).copy_from(model)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3, eps=1e-7)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=0)
    t_source, t_target = torch.from_numpy(source), torch.from_numpy(target)
    tag = f"seq2seq Bahdanau B={s2s.B} T={s2s.T} E={s2s.E} H={s2s.H} V={s2s.V} training step (train_on_batch, Adam)"
    return tag, steps | _torch_steps(lambda: train_step(net, optimizer, loss_fn, t_source, t_target)), None


# ----------------------------------------------------------------------------- the main job's fit
def fit_steps():
    os.environ.setdefault("ATTNX_DATA_DIR", str(REPO.parent / "shared" / "data"))
    sys.path.insert(0, str(REPO / "examples"))
    import attnx
    import sentiment
    import sentiment_torch

    def attnx_fit(policy):
        attnx.mixed_precision.set_global_policy(policy)
        try:
            sentiment.run(0, epochs=10, verbose=0)
        finally:
            attnx.mixed_precision.set_global_policy(None)
    steps = {f"attnx {policy}": (lambda policy=policy: attnx_fit(policy)) for policy in POLICIES}
    return ("main job fit, 10 epochs (examples/sentiment.py vs sentiment_torch.py)",
            steps | _torch_steps(lambda: sentiment_torch.run(0, epochs=10)), None, 1)


# ----------------------------------------------------------------------------- the interleaved run
ROWS = {"lstm": lstm_steps, "encoder": encoder_steps, "transformer": transformer_steps, "seq2seq": seq2seq_steps,
        "fit": fit_steps}


def _without_amx(step):
    """step with the bf16 products on the AVX-512 tiles instead of AMX (a CPU that has AMX)."""
    from attnx import _core

    def run():
        _core._amx_allow(False)
        try:
            return step()
        finally:
            _core._amx_allow(True)
    return run


def cores_busy(step, runs):
    """The process's CPU time over the wall time of `runs` calls of step: how many cores a step keeps busy."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(runs):
        step()
    return (time.process_time() - cpu) / (time.perf_counter() - wall)


def run_row(tag, steps, tokens, runs=3):
    """Times `steps` in ROUNDS rotated rounds, each the median of `runs` runs (after as many untimed);
    on a CPU with AMX also attnx mixed_bfloat16 without it."""
    from attnx import _core
    amx = _core._config()["amx_bf16"]
    if amx:
        steps = steps | {"attnx bf16 without AMX": _without_amx(steps["attnx mixed_bfloat16"])}
    names = list(steps)
    for fn in steps.values():  # warm-up
        for _ in range(runs):
            fn()
    times = {n: [] for n in names}
    for r in range(ROUNDS):
        for n in names[r % len(names):] + names[:r % len(names)]:
            times[n].append(median_time(steps[n], 0, runs, ROUND_TIME if runs > 1 else 0.0, SETTLE))
    print(f"{tag}, median of {ROUNDS} rounds:")
    for n in names:
        seconds = statistics.median(times[n])
        rate = f" {tokens / seconds:10.0f} target tokens/s" if tokens else ""
        print(f"  {n:<24s} {seconds * 1e3:9.2f} ms{rate}")

    def ratio(num, den):
        r = [a / b for a, b in zip(times[num], times[den])]
        return f"{statistics.median(r):5.2f}x ({min(r):.2f}-{max(r):.2f})"
    print(f"  torch float32 / attnx mixed_bfloat16        {ratio('torch float32', 'attnx mixed_bfloat16')}")
    print(f"  torch autocast bf16 / attnx mixed_bfloat16  {ratio('torch autocast bf16', 'attnx mixed_bfloat16')}")
    print(f"  attnx float32 / attnx mixed_bfloat16        {ratio('attnx float32', 'attnx mixed_bfloat16')}")
    print(f"  torch float32 / attnx float32               {ratio('torch float32', 'attnx float32')}")
    print(f"  torch float32 / torch autocast bf16         {ratio('torch float32', 'torch autocast bf16')}")
    if amx:
        print(f"  attnx bf16 without AMX / with AMX           {ratio('attnx bf16 without AMX', 'attnx mixed_bfloat16')}")
    print("  cores busy during a step (CPU time / wall): "
          + ", ".join(f"{n} {cores_busy(steps[n], runs):.2f}" for n in names))
    sys.stdout.flush()


def main(rows):
    import attnx
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        raise SystemExit(f"bench_bf16: unknown rows {unknown}; expected some of {', '.join(ROWS)}")
    threads = setup_threads()
    config = attnx._core._config()
    print(f"threads {threads}; bf16 products: {attnx._core._bf16_config()}; AMX bf16 tiles: {config['amx_bf16']}")
    for row in rows:
        run_row(*ROWS[row]())


if __name__ == "__main__":
    np.seterr(all="ignore")
    main(sys.argv[1:] or list(ROWS))
