"""Your classes and functions, registered so that `attnx.load_model` finds them by name (Keras'
``register_keras_serializable``), or given to it as ``custom_objects``.

    @attnx.register_serializable()
    def masked_mse(y_true, y_pred):
        ...

    model.compile("adam", loss=masked_mse)     # saved by name, found again when the file is loaded

Files hold ``package>name`` (Keras' form). attnx's own classes keep their bare names, and no class of
yours replaces them: yours, registered or not, are saved under ``package>name`` (``Custom>`` + the
class name when not registered), and a name two of yours claim is an error naming both. Older files'
bare names still load. This module imports nothing of attnx.
"""
import contextlib
import contextvars

_registered = {}  # "package>name" -> the class or function
_by_short_name = {}  # "name" -> {"package>name": class or function}: the names old files hold
_scope = contextvars.ContextVar("attnx_custom_objects", default=None)
BUILT_IN_PACKAGE = "attnx"  # attnx's own classes, saved under their bare class names
_USER_PACKAGE = "Custom"  # Keras' default package: a class of yours, registered with it or not


def register_serializable(package=_USER_PACKAGE, name=None):
    """A decorator registering a class or a function under ``package>name`` (`name` default its
    ``__name__``), Keras' form, which saved files hold. A name taken by another class or function is a
    ValueError naming both (defining the same class again, as a notebook cell run twice, replaces it);
    the package "attnx" is attnx's own."""
    if not isinstance(package, str) or (name is not None and not isinstance(name, str)):
        raise TypeError(f"register_serializable: package and name must be strings, got {package!r}, {name!r}")
    if not package or ">" in package or (name is not None and (not name or ">" in name)):
        raise ValueError(f"register_serializable: package and name must be non-empty and without '>', got "
                         f"{package!r}, {name!r}")

    def decorator(obj):
        if not callable(obj):
            raise TypeError(f"register_serializable: only a class or a function can be registered, got {obj!r}")
        if package == BUILT_IN_PACKAGE and not _is_built_in(obj):
            raise ValueError(f"register_serializable: the package {BUILT_IN_PACKAGE!r} is attnx's own; register "
                             f"{_describe(obj)} under another package")
        short = name or obj.__name__
        full = f"{package}>{short}"
        taken = _registered.get(full)
        if taken is not None and taken is not obj and _definition(taken) != _definition(obj):
            raise ValueError(f"register_serializable: {full!r} is already registered to {_describe(taken)}; "
                             f"{_describe(obj)} cannot take it too: give it another package or name")
        obj._attnx_registered_name = full
        _registered[full] = obj
        _by_short_name.setdefault(short, {})[full] = obj
        return obj
    return decorator


def registered_name(obj):
    """The name `obj` was registered under, or None."""
    full = getattr(obj, "_attnx_registered_name", None)
    return full if full is not None and _registered.get(full) is obj else None


def get_registered_object(name):
    """The class or function named `name` in the active ``custom_objects`` (by its full or its bare
    name) or the registry (``package>name``; a bare name, as older files hold, when one package
    registered it), or None."""
    if not isinstance(name, str):
        return None
    scope = _scope.get() or {}
    if name in scope:
        return scope[name]
    package, _, short = name.rpartition(">")
    if package and short in scope:
        return scope[short]
    if package:
        return _registered.get(name)
    found = _by_short_name.get(name, {})
    if len(found) > 1:
        raise ValueError(f"the name {name!r} is registered by several packages ({', '.join(sorted(found))}): give "
                         "load_model custom_objects={name: the class or function this file means}")
    return next(iter(found.values()), None)


class ClassRegistry:
    """The classes of one kind (layers, losses) by the names files hold: attnx's own by their bare class
    names, which no class of yours replaces; a registered class by ``package>name``; a class of yours
    not registered by ``Custom>`` + its class name (the last one defined, as before registration). Bare
    names of older files find attnx's class first, then a registered or unregistered class of yours."""

    def __init__(self, kind):
        self.kind = kind
        self._built_in = {}  # name -> attnx's class
        self._yours = {}  # name -> the last class of yours defined with it

    def add(self, cls):
        """Called for every new subclass (``__init_subclass__``)."""
        (self._built_in if _is_built_in(cls) else self._yours)[cls.__name__] = cls

    def name_of(self, cls):
        """The name a file holds for `cls`."""
        if _is_built_in(cls):
            return cls.__name__
        full = registered_name(cls)
        if full is not None:
            return full
        full = f"{_USER_PACKAGE}>{cls.__name__}"
        taken = _registered.get(full)
        if taken is not None and _definition(taken) != _definition(cls):
            raise ValueError(f"{_describe(cls)} would be saved as {full!r}, which is registered to {_describe(taken)}: "
                             f"register {cls.__name__} with @attnx.register_serializable(package=...)")
        return full

    def get(self, name, default=None):
        """The class a file's `name` means, or `default`: custom_objects name any; then attnx's own."""
        if not isinstance(name, str):
            return default  # a crafted file's name: "Unknown ... class"
        if name in self._built_in and name not in (_scope.get() or {}):
            return self._built_in[name]  # attnx's own class: nothing of yours replaces it
        found = get_registered_object(name)
        if isinstance(found, type):
            return found
        package, _, short = name.rpartition(">")
        if not package:
            return self._yours.get(name, default)
        return self._yours.get(short, default) if package == _USER_PACKAGE else default

    def __getitem__(self, name):
        found = self.get(name)
        if found is None:
            raise ValueError(f"Unknown {self.kind} class {name!r}: register it with @attnx.register_serializable() "
                             "or give it in load_model's custom_objects")
        return found

    def __contains__(self, name):
        return self.get(name) is not None


def _is_built_in(obj):
    return (getattr(obj, "__module__", "") or "").startswith(BUILT_IN_PACKAGE + ".")


def _definition(obj):
    return getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)


def _describe(obj):
    module, qualname = _definition(obj)
    return f"{module}.{qualname}" if qualname else repr(obj)


@contextlib.contextmanager
def custom_object_scope(custom_objects):
    """Within the block, the names of `custom_objects` ({name: class or function}) resolve to them."""
    if custom_objects is not None and not isinstance(custom_objects, dict):
        raise TypeError(f"custom_objects must be a dict of name -> class or function, got "
                        f"{type(custom_objects).__name__}")
    token = _scope.set({**(_scope.get() or {}), **(custom_objects or {})})
    try:
        yield
    finally:
        _scope.reset(token)
