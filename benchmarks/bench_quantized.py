"""int8 inference (issue 32) against PyTorch, same threads, one run: the recurrent encoders of
bench_rnn.py ((a) the sentiment model Embedding(5000, 32) -> LSTM(100) -> Dense(1), B=32, T=32;
(b) LSTM(256), B=64, T=128, E=128; (c) BiLSTM(100)) with every layer quantized by
attnx.quantization (model.quantize("int8")), against

- PyTorch float32 (the same modules as bench_rnn.py),
- PyTorch torch.ao.quantization.quantize_dynamic (int8 nn.LSTM and nn.Linear, qint8 weights),
- attnx float32 (the "torch" column of that row is attnx's own float32 time).

    python benchmarks/run.py quantized
"""
import numpy as np

from bench_rnn import AttnxModel, _data, torch_model
from harness import compare


def attnx_int8(rnn, embed, units, bidirectional, ids):
    model = AttnxModel(rnn, embed, units, bidirectional)
    float_out = model.predict(ids)
    for layer in model.layers:
        layer.quantize("int8")
    int8_out = model.predict(ids)
    err = np.abs(int8_out - float_out).max() / np.abs(float_out).max()
    return model, err


def torch_dynamic(predict_fp32):
    """PyTorch's dynamic int8 quantization of the float model behind predict_fp32."""
    import torch
    return torch.ao.quantization.quantize_dynamic(predict_fp32.module, {torch.nn.LSTM, torch.nn.Linear}, dtype=torch.qint8)


def run_case(name, rnn, B, T, embed, units, bidirectional=False):
    import torch
    ids, _ = _data(B, T)
    ids_t = torch.from_numpy(ids)
    ours, err = attnx_int8(rnn, embed, units, bidirectional, ids)
    ours_fp32 = AttnxModel(rnn, embed, units, bidirectional)
    _, t_predict = torch_model(rnn, embed, units, bidirectional)
    qnet = torch_dynamic(t_predict)

    def t_int8():
        with torch.no_grad():
            qnet(ids_t)

    print(f"{name}: attnx int8 output vs its float32: max |diff| / max |out| = {err:.4f}")
    return [compare(f"{name} int8 vs torch fp32", lambda: ours.predict(ids), lambda: t_predict(ids_t)),
            compare(f"{name} int8 vs torch quantize_dynamic", lambda: ours.predict(ids), t_int8),
            compare(f"{name} int8 vs attnx fp32", lambda: ours.predict(ids), lambda: ours_fp32.predict(ids))]


def main():
    from attnx import _core
    print(f"attnx int8 tiles: {_core.int8_level()}")
    results = []
    results += run_case("(a) LSTM(100) B=32 T=32 E=32", "lstm", 32, 32, 32, 100)
    results += run_case("(b) LSTM(256) B=64 T=128 E=128", "lstm", 64, 128, 128, 256)
    results += run_case("(c) BiLSTM(100) B=32 T=32 E=32", "lstm", 32, 32, 32, 100, bidirectional=True)
    return results
