"""Optimizers whose updates run in C++ over the parameter buffers, and learning-rate schedules.

Update rules are PyTorch's (equal to Keras' for a constant learning rate); defaults are Keras'.
Gradient clipping as in Keras: `clipvalue` (elementwise), `clipnorm` (per parameter) and
`global_clipnorm` (over all parameters together).
"""
import itertools
import math
import operator

import numpy as np

from . import _core, constraints


# ----------------------------------------------------------------------------- schedules
class LearningRateSchedule:
    """Maps the optimizer's step count (0 for the first update) to a learning rate."""

    def __call__(self, step):
        raise NotImplementedError

    def get_config(self):
        return dict(self.__dict__)


class ExponentialDecay(LearningRateSchedule):
    """lr = initial_learning_rate * decay_rate ** (step / decay_steps) (floored if staircase)."""

    def __init__(self, initial_learning_rate, decay_steps, decay_rate, staircase=False):
        if decay_steps <= 0:
            raise ValueError(f"ExponentialDecay: decay_steps must be positive, got {decay_steps}")
        self.initial_learning_rate, self.decay_steps = float(initial_learning_rate), int(decay_steps)
        self.decay_rate, self.staircase = float(decay_rate), bool(staircase)

    def __call__(self, step):
        p = step / self.decay_steps
        return self.initial_learning_rate * self.decay_rate ** (math.floor(p) if self.staircase else p)


class PiecewiseConstantDecay(LearningRateSchedule):
    """values[i] while step <= boundaries[i] (Keras' rule), values[-1] after the last boundary."""

    def __init__(self, boundaries, values):
        if len(values) != len(boundaries) + 1:
            raise ValueError("PiecewiseConstantDecay: needs one more value than boundaries")
        self.boundaries, self.values = list(boundaries), [float(v) for v in values]

    def __call__(self, step):
        for b, v in zip(self.boundaries, self.values):
            if step <= b:
                return v
        return self.values[-1]


class CosineDecay(LearningRateSchedule):
    """Optional linear warmup to `warmup_target`, then cosine decay to alpha * peak over decay_steps."""

    def __init__(self, initial_learning_rate, decay_steps, alpha=0.0, warmup_target=None, warmup_steps=0):
        self.initial_learning_rate, self.decay_steps, self.alpha = float(initial_learning_rate), int(decay_steps), alpha
        self.warmup_target, self.warmup_steps = warmup_target, int(warmup_steps)

    def __call__(self, step):
        peak = self.initial_learning_rate if self.warmup_target is None else float(self.warmup_target)
        if step < self.warmup_steps:
            return self.initial_learning_rate + (peak - self.initial_learning_rate) * step / self.warmup_steps
        t = min(step - self.warmup_steps, self.decay_steps) / max(1, self.decay_steps)
        return peak * ((1 - self.alpha) * 0.5 * (1 + math.cos(math.pi * t)) + self.alpha)


class NoamDecay(LearningRateSchedule):
    """The warm-up and inverse-square-root decay of "Attention Is All You Need" (section 5.3):
    ``lr = scale * model_dim ** -0.5 * min(s ** -0.5, s * warmup_steps ** -1.5)``, s = step + 1:
    linear growth for `warmup_steps` steps, to ``scale * (model_dim * warmup_steps) ** -0.5``, then
    proportional to 1 / sqrt(s)."""

    def __init__(self, model_dim, warmup_steps=4000, scale=1.0):
        if int(model_dim) <= 0 or int(warmup_steps) <= 0 or not float(scale) > 0:
            raise ValueError(f"NoamDecay: model_dim, warmup_steps and scale must be positive, got {model_dim}, "
                             f"{warmup_steps}, {scale}")
        self.model_dim, self.warmup_steps, self.scale = int(model_dim), int(warmup_steps), float(scale)

    def __call__(self, step):
        s = step + 1
        return self.scale * self.model_dim ** -0.5 * min(s ** -0.5, s * self.warmup_steps ** -1.5)


# ---------------------------------------------------------------------------- optimizers
class Optimizer:
    """Base class.

    ``optimizer.apply(params_and_grads)`` takes ``(param, grad)`` pairs (NumPy arrays updated in
    place) and performs one step; ``apply_gradients(zip(grads, params))`` is Keras' spelling.
    """

    def __init__(self, learning_rate=0.001, clipnorm=None, global_clipnorm=None, clipvalue=None, name=None):
        if sum(c is not None for c in (clipnorm, global_clipnorm)) > 1:
            raise ValueError("Only one of clipnorm and global_clipnorm can be set")
        self.learning_rate = learning_rate
        self.clipnorm, self.global_clipnorm, self.clipvalue = clipnorm, global_clipnorm, clipvalue
        self.name = name or type(self).__name__.lower()
        self.iterations = 0
        self._slots = {}  # id(param) -> (param, [state buffers])

    @property
    def current_learning_rate(self):
        lr = self.learning_rate
        return float(lr(self.iterations)) if callable(lr) else float(lr)

    def apply_gradients(self, grads_and_vars):
        """One step from ``(gradient, variable)`` pairs (Keras' and TensorFlow's order), e.g.
        ``zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables)``. A None
        gradient (a variable the loss does not depend on) leaves its variable as it is, as in Keras."""
        self.apply([(v, g) for g, v in grads_and_vars if g is not None])

    def apply(self, params_and_grads):
        pairs = self._checked_pairs(list(params_and_grads))
        if not pairs:
            return
        params = [p for p, _ in pairs]
        grads = [g for _, g in pairs]
        if self.clipvalue is not None or self.clipnorm is not None or self.global_clipnorm is not None:
            grads = [np.array(g, order="C") for g in grads]  # clip copies: the caller's gradients stay as they are
        else:  # any layout, read-only too (np.require costs a microsecond to pass an array that needs nothing)
            grads = [g if g.flags.c_contiguous and g.flags.aligned and g.flags.writeable
                     else np.require(g, requirements="CAW") for g in grads]
        if self.clipvalue is not None:
            _core.clip_(grads, lo=-float(self.clipvalue), hi=float(self.clipvalue))
        if self.clipnorm is not None:
            for g in grads:
                norm = _core.global_norm([g])
                if norm > self.clipnorm:
                    _core.scale_([g], self.clipnorm / norm)
        if self.global_clipnorm is not None:
            norm = _core.global_norm(grads)
            if norm > self.global_clipnorm:
                _core.scale_(grads, self.global_clipnorm / norm)
        lr = self.current_learning_rate
        self.iterations += 1
        # parameters of one dtype per kernel call
        for dtype in {p.dtype for p in params}:
            group = [(p, g) for p, g in zip(params, grads) if p.dtype == dtype]
            ps = [p for p, _ in group]
            self._update(ps, [g for _, g in group], [self._state(p) for p in ps], lr)
        constraints.apply_constraints(params)  # Keras: each variable's constraint after its update

    _last_pairs = ((), [])  # the last (param, grad) pairs given to apply and their checked, non-empty ones

    def _checked_pairs(self, params_and_grads):
        """The (param, grad) pairs with parameters (empty ones dropped), after checking types, shapes and
        dtypes; the same arrays as the last step's (a training loop's) are not checked again: an array's
        type and dtype stay, and a reshaped one keeps its size, which the kernels check."""
        given, checked = self._last_pairs
        if len(given) == len(params_and_grads) and all(  # (map: no Python call per array)
                map(operator.is_, itertools.chain.from_iterable(params_and_grads), itertools.chain.from_iterable(given))):
            return checked
        for p, g in params_and_grads:
            if not isinstance(p, np.ndarray) or not isinstance(g, np.ndarray):
                raise TypeError(f"{self.name}: parameters and gradients must be NumPy arrays (updated in place), "
                                f"got {type(p).__name__} and {type(g).__name__}")
        pairs = [(p, g) for p, g in params_and_grads if p.size]
        for p, g in pairs:
            if p.shape != g.shape or p.dtype != g.dtype:
                raise ValueError(f"{self.name}: gradient {g.shape} {g.dtype} does not match parameter "
                                 f"{p.shape} {p.dtype}")
        self._last_pairs = (params_and_grads, pairs)
        return pairs

    def _state(self, param):
        slot = self._slots.get(id(param))
        if slot is None or slot[0] is not param:
            slot = (param, [np.zeros_like(param) for _ in range(self.num_slots)])
            self._slots[id(param)] = slot
        return slot[1]

    num_slots = 0

    def _update(self, params, grads, states, lr):
        raise NotImplementedError

    def get_config(self):
        lr = self.learning_rate
        if isinstance(lr, LearningRateSchedule):
            lr = {"class_name": type(lr).__name__, "config": lr.get_config()}
        return {"learning_rate": lr, "clipnorm": self.clipnorm, "global_clipnorm": self.global_clipnorm,
                "clipvalue": self.clipvalue}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        lr = config.get("learning_rate")
        if isinstance(lr, dict):
            config["learning_rate"] = globals()[lr["class_name"]](**lr["config"])
        return cls(**config)


class SGD(Optimizer):
    """Stochastic gradient descent with optional (Nesterov) momentum and L2 weight decay."""

    num_slots = 1

    def __init__(self, learning_rate=0.01, momentum=0.0, nesterov=False, weight_decay=0.0, **kwargs):
        super().__init__(learning_rate, **kwargs)
        if momentum < 0:
            raise ValueError(f"SGD: momentum must be >= 0, got {momentum}")
        self.momentum, self.nesterov, self.weight_decay = float(momentum), bool(nesterov), float(weight_decay)

    def _update(self, params, grads, states, lr):
        _core.sgd_update(params=params, grads=grads, bufs=[s[0] for s in states], lr=lr, momentum=self.momentum,
                         nesterov=self.nesterov, weight_decay=self.weight_decay)

    def get_config(self):
        return {**super().get_config(), "momentum": self.momentum, "nesterov": self.nesterov,
                "weight_decay": self.weight_decay}


class Adam(Optimizer):
    """Adam (Kingma & Ba). `weight_decay` is L2 added to the gradient, as in torch.optim.Adam."""

    num_slots = 2
    decoupled = False

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7, weight_decay=0.0, **kwargs):
        super().__init__(learning_rate, **kwargs)
        self.beta_1, self.beta_2, self.epsilon = float(beta_1), float(beta_2), float(epsilon)
        self.weight_decay = float(weight_decay)

    def _update(self, params, grads, states, lr):
        _core.adam_update(params=params, grads=grads, ms=[s[0] for s in states], vs=[s[1] for s in states], lr=lr,
                          beta1=self.beta_1, beta2=self.beta_2, eps=self.epsilon, step=self.iterations,
                          weight_decay=self.weight_decay, decoupled=self.decoupled)

    def get_config(self):
        return {**super().get_config(), "beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon,
                "weight_decay": self.weight_decay}


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): p *= 1 - lr * weight_decay."""

    decoupled = True

    def __init__(self, learning_rate=0.001, weight_decay=0.004, **kwargs):
        super().__init__(learning_rate, weight_decay=weight_decay, **kwargs)


class RMSprop(Optimizer):
    """RMSprop with optional momentum and centering."""

    def __init__(self, learning_rate=0.001, rho=0.9, momentum=0.0, epsilon=1e-7, centered=False, weight_decay=0.0,
                 **kwargs):
        super().__init__(learning_rate, **kwargs)
        self.rho, self.momentum, self.epsilon = float(rho), float(momentum), float(epsilon)
        self.centered, self.weight_decay = bool(centered), float(weight_decay)
        self.num_slots = 3

    def _update(self, params, grads, states, lr):
        _core.rmsprop_update(params=params, grads=grads, vs=[s[0] for s in states],
                             mean_grads=[s[1] for s in states] if self.centered else None,
                             bufs=[s[2] for s in states] if self.momentum else None,
                             lr=lr, rho=self.rho, eps=self.epsilon, momentum=self.momentum,
                             weight_decay=self.weight_decay)

    def get_config(self):
        return {**super().get_config(), "rho": self.rho, "momentum": self.momentum, "epsilon": self.epsilon,
                "centered": self.centered, "weight_decay": self.weight_decay}


_ALIASES = {"sgd": SGD, "adam": Adam, "adamw": AdamW, "rmsprop": RMSprop}


def get(identifier):
    if isinstance(identifier, Optimizer):
        return identifier
    if isinstance(identifier, str) and identifier.lower() in _ALIASES:
        return _ALIASES[identifier.lower()]()
    if isinstance(identifier, dict):
        return {c.__name__: c for c in _ALIASES.values()}[identifier["class_name"]].from_config(identifier["config"])
    raise ValueError(f"Unknown optimizer {identifier!r}; expected one of {sorted(_ALIASES)} or an Optimizer")


def serialize(opt):
    return {"class_name": type(opt).__name__, "config": opt.get_config()}

