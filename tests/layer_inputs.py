"""Random inputs of the layer-contract cases (test_layer_contract.py, keras_layer_cases.py)."""


def sequence(rng, B, T, C=4):
    return rng.standard_normal((B, T, C))


def mask(rng, B, T):
    """A (B, T) step mask: every row's first step real, and with B > 1 a fully masked last row (allowed
    everywhere, gives zeros)."""
    m = rng.random((B, T)) < 0.7
    m[:, 0] = True
    if B > 1:
        m[-1] = False
    return m
