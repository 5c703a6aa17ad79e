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

__all__ = [
    "OpError",
    "SluiceError",
    "CancelledError",
    "UnknownError",
    "InvalidArgumentError",
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
