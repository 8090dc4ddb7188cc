"""Your classes and functions, registered so that `attnx.load_model` finds them by name (Keras'
``register_keras_serializable``), or given to it as ``custom_objects``.

    @attnx.register_serializable()
    def masked_mse(y_true, y_pred):
        ...

    model.compile("adam", loss=masked_mse)     # saved by name, found again when the file is loaded

Layer, Model and Loss subclasses are found by their class name anyway; registering them adds the
``package>name`` spelling. This module imports nothing of attnx.
"""
import contextlib
import contextvars

_registered = {}  # "package>name" and "name" -> the class or function
_scope = contextvars.ContextVar("attnx_custom_objects", default=None)


def register_serializable(package="Custom", name=None):
    """A decorator registering a class or a function under `name` (default its ``__name__``)."""
    if not isinstance(package, str) or (name is not None and not isinstance(name, str)):
        raise TypeError(f"register_serializable: package and name must be strings, got {package!r}, {name!r}")

    def decorator(obj):
        if not callable(obj):
            raise TypeError(f"register_serializable: only a class or a function can be registered, got {obj!r}")
        key = name or obj.__name__
        obj._attnx_registered_name = f"{package}>{key}"
        _registered[obj._attnx_registered_name] = obj
        _registered[key] = obj
        return obj
    return decorator


def registered_name(obj):
    """The name `obj` was registered under, or None."""
    return getattr(obj, "_attnx_registered_name", None) if _registered.get(
        getattr(obj, "_attnx_registered_name", None)) is obj else None


def get_registered_object(name):
    """The class or function named `name` in the active ``custom_objects`` or the registry, or None."""
    scope = _scope.get() or {}
    return scope.get(name, _registered.get(name))


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
