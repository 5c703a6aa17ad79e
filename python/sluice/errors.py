"""Exceptions raised by Sluice, named as ``tf.errors``' classes.

Every error Sluice raises is an :class:`OpError` (also exported as :class:`SluiceError`); its
message is the Rust error's text, which follows tf.data's. The class tells the kind, one class per
gRPC status code as in TensorFlow::

    >>> import sluice
    >>> try:
    ...     sluice.distribute("sideways", "localhost:1")(sluice.data.Dataset.range(3))
    ... except sluice.errors.InvalidArgumentError as e:
    ...     print(e)
    tf.data service processing mode should be a `tf.data.experimental.service.ShardingPolicy`, `"parallel_epochs"`, or `"distributed_epoch"`. Got 'sideways'.
"""

from __future__ import annotations

import builtins
from typing import Dict, Optional, Type

__all__ = [
    "OpError",
    "SluiceError",
    "CancelledError",
    "UnknownError",
    "InvalidArgumentError",
    "InvalidArgumentValueError",
    "DeadlineExceededError",
    "NotFoundError",
    "AlreadyExistsError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "FailedPreconditionError",
    "AbortedError",
    "OutOfRangeError",
    "UnimplementedError",
    "InternalError",
    "UnavailableError",
    "DataLossError",
    "UnauthenticatedError",
    "PythonFunctionError",
]


class OpError(Exception):
    """The base class of Sluice's errors (tf's ``tf.errors.OpError``).

    ``message`` is the error's text.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


SluiceError = OpError
"""Sluice's name for :class:`OpError`."""


class CancelledError(OpError):
    """An operation was cancelled."""


class UnknownError(OpError):
    """An error of no other kind (e.g. an I/O failure other than a missing file)."""


class InvalidArgumentError(OpError):
    """An argument was malformed: a bad option, an unknown function, a wrong dtype."""


class InvalidArgumentValueError(InvalidArgumentError, ValueError):
    """An argument of a Python call that tf.data rejects with ``ValueError`` (a ``job_name``
    that is not a string, an unknown processing mode, a cross-trainer cache without a trainer
    id): both an :class:`InvalidArgumentError` and a ``ValueError``, so code written for
    tf.data catches it, with tf.data's text::

        >>> import sluice
        >>> try:
        ...     sluice.CrossTrainerCache(trainer_id=None)
        ... except ValueError as e:
        ...     print(e)
        tf.data service cross-trainer cache requires a non-empty trainer ID.
    """


class DeadlineExceededError(OpError):
    """A deadline passed before the operation completed."""


class NotFoundError(OpError):
    """Something named does not exist: a dataset id, a job, a file."""


class AlreadyExistsError(OpError):
    """Something to be created exists already."""


class PermissionDeniedError(OpError):
    """The caller may not do this."""


class ResourceExhaustedError(OpError):
    """A resource (memory, a quota) ran out."""


class FailedPreconditionError(OpError):
    """The request is valid but the state does not allow it (e.g. a mismatched dataset id)."""


class AbortedError(OpError):
    """The operation was aborted, usually by a concurrent one."""


class OutOfRangeError(OpError):
    """The end of the input was reached where an element was required."""


class UnimplementedError(OpError):
    """The operation is not supported."""


class InternalError(OpError):
    """An internal failure, e.g. a worker that failed to produce an element."""


class UnavailableError(OpError):
    """No dispatcher replica (or worker) could be reached in time; retrying may help."""


class DataLossError(OpError):
    """Data was corrupt or lost, e.g. a corrupt TFRecord."""


class UnauthenticatedError(OpError):
    """The caller's credentials were missing or wrong."""


class PythonFunctionError(OpError):
    """A user's Python function in a pipeline raised an exception, on a worker or here.

    When the original exception's class is a built-in one (``ValueError``, ``KeyError``, ...),
    the error raised is also an instance of it, so ``except ValueError`` catches it. Its
    ``str`` is ``"ValueError: message"``, then where it was raised and the remote traceback::

        >>> import sluice
        >>> ds = sluice.data.Dataset.range(3).map(lambda x: int("x"))
        >>> try:
        ...     next(iter(ds))
        ... except ValueError as e:
        ...     print(e.type_name, isinstance(e, sluice.errors.PythonFunctionError))
        ValueError True

    Attributes: ``type_module`` and ``type_name`` (the original class's ``__module__`` and
    ``__qualname__``), ``remote_traceback`` (the formatted traceback where it was raised), and
    ``function`` (the function's qualified name).
    """

    def __init__(
        self,
        message: str,
        type_module: str = "",
        type_name: str = "",
        remote_traceback: str = "",
        function: str = "",
    ) -> None:
        super().__init__(message)
        self.type_module = type_module
        self.type_name = type_name
        self.remote_traceback = remote_traceback
        self.function = function

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"PythonFunctionError({self.type_name!r}, {self.message!r})"


# The subclasses of PythonFunctionError made for built-in exception classes, by class.
_combined: Dict[type, Type[PythonFunctionError]] = {}


def _builtin_exception(type_module: str, type_name: str) -> Optional[type]:
    """The built-in exception class named, if it is one (``KeyboardInterrupt`` and
    ``SystemExit`` too): only ``builtins`` is looked in, so no module is ever imported on a
    remote exception's word."""
    if type_module != "builtins" or "." in type_name:
        return None
    cls = getattr(builtins, type_name, None)
    if isinstance(cls, type) and issubclass(cls, BaseException):
        return cls
    return None


def _python_function_error(
    context: str,
    type_module: str,
    type_name: str,
    message: str,
    remote_traceback: str,
    function: str,
) -> PythonFunctionError:
    """The exception the reader raises for a Python function's exception (called by the
    native module). ``context`` is Sluice's own text, which says where it was raised."""
    text = f"{type_name}: {message}\n\n{context}"
    if remote_traceback:
        text += f"\n\nRemote traceback:\n{remote_traceback.rstrip()}"
    args = (text, type_module, type_name, remote_traceback, function)
    builtin = _builtin_exception(type_module, type_name)
    if builtin is not None:
        cls = _combined.get(builtin)
        if cls is None:
            try:
                cls = type(
                    "PythonFunctionError",
                    (PythonFunctionError, builtin),
                    {"__module__": __name__, "__qualname__": "PythonFunctionError"},
                )
            except TypeError:
                cls = PythonFunctionError  # a layout that does not combine
            _combined[builtin] = cls
        try:
            return cls(*args)
        except Exception:  # a class whose constructor wants other arguments
            pass
    return PythonFunctionError(*args)


_SERVER_START_CLASSES: dict = {}


def server_start_error(error: OpError) -> OpError:
    """``error``, raised by a server that could not start, as an instance of its own class that
    is also a ``RuntimeError`` (tf.data's class for a server that cannot start), with the same
    message: code written for tf.data catches it, and code written for Sluice still sees its
    class (``FailedPreconditionError`` for a worker outside the worker list, ...)."""
    cls = type(error)
    if isinstance(error, RuntimeError):
        return error
    both = _SERVER_START_CLASSES.get(cls)
    if both is None:
        both = type(cls.__name__, (cls, RuntimeError), {"__module__": cls.__module__})
        _SERVER_START_CLASSES[cls] = both
    return both(error.message)
