"""``Options``: tf.data's ``tf.data.Options`` for a Sluice dataset.

Set them with :meth:`Dataset.with_options`; they travel in the dataset's definition (to the
service's workers too). Like tf.data, applying options twice merges them: a field set by the
later call wins, the others keep their earlier values::

    >>> from sluice.data import Dataset, Options
    >>> from sluice.data.experimental import AutoShardPolicy
    >>> a = Options(); a.deterministic = False
    >>> b = Options(); b.experimental_distribute.auto_shard_policy = AutoShardPolicy.DATA
    >>> o = Dataset.range(3).with_options(a).with_options(b).options()
    >>> o.deterministic, o.experimental_distribute.auto_shard_policy
    (False, <AutoShardPolicy.DATA: 2>)
"""

from __future__ import annotations

import enum
from typing import Any, Optional

from sluice.errors import InvalidArgumentValueError


class AutoShardPolicy(enum.IntEnum):
    """tf.data's ``AutoShardPolicy`` (same names and values)."""

    OFF = -1
    AUTO = 0
    FILE = 1
    DATA = 2
    HINT = 3


class ExternalStatePolicy(enum.IntEnum):
    """tf.data's ``ExternalStatePolicy`` (same names and values): what saving a dataset whose
    ops hold state outside it (Python functions) does."""

    WARN = 0
    IGNORE = 1
    FAIL = 2


# Their numbers in the definition (0: not set).
_AUTO_SHARD_CODES = {
    AutoShardPolicy.OFF: 1,
    AutoShardPolicy.AUTO: 2,
    AutoShardPolicy.FILE: 3,
    AutoShardPolicy.DATA: 4,
    AutoShardPolicy.HINT: 5,
}
_EXTERNAL_STATE_CODES = {
    ExternalStatePolicy.WARN: 1,
    ExternalStatePolicy.IGNORE: 2,
    ExternalStatePolicy.FAIL: 3,
}


class _OptionsBase:
    """Options objects: fields start unset (``None``), reading one unset gives tf.data's
    default, and setting a name that is not a field is an error (tf.data's text)."""

    _fields: "dict[str, Any]" = {}

    def __init__(self) -> None:
        object.__setattr__(self, "_values", {})

    def __getattr__(self, name: str) -> Any:
        fields = type(self)._fields
        if name in fields:
            return self._values.get(name, fields[name])
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in type(self)._fields:
            raise AttributeError(f"Cannot set the property {name} on {type(self).__name__}.")
        self._values[name] = self._check(name, value)

    def _check(self, name: str, value: Any) -> Any:
        return value

    def _is_set(self, name: str) -> bool:
        return name in self._values

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return False
        return bool(self._values == other._values)  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        values = ", ".join(f"{k}={v!r}" for k, v in sorted(self._values.items()))
        return f"{type(self).__name__}({values})"


class DistributeOptions(_OptionsBase):
    """tf.data's ``DistributeOptions``: ``auto_shard_policy`` (default ``AUTO``), which
    :meth:`sluice.strategy.DistributeStrategy.experimental_distribute_dataset` uses when set."""

    _fields = {"auto_shard_policy": AutoShardPolicy.AUTO, "num_devices": None}

    def _check(self, name: str, value: Any) -> Any:
        if name == "auto_shard_policy":
            if not isinstance(value, AutoShardPolicy):
                raise InvalidArgumentValueError(
                    f"auto_shard_policy must be a sluice.data.experimental.AutoShardPolicy, "
                    f"got {value!r}"
                )
        return value


class Options(_OptionsBase):
    """tf.data's ``tf.data.Options``, the fields Sluice carries:

    - ``deterministic`` (default ``True``): accepted; Sluice's parallel Python maps keep their
      input order either way, so ``False`` changes nothing.
    - ``experimental_external_state_policy`` (an :class:`ExternalStatePolicy`, default
      ``WARN``): what registering the dataset with the service does about its Python functions,
      whose state lives outside the dataset (their code, what they capture): ``FAIL`` refuses
      it with :class:`~sluice.errors.FailedPreconditionError`, ``WARN`` (when set) logs them,
      ``IGNORE`` says nothing.
    - ``experimental_distribute``: a :class:`DistributeOptions`.
    """

    _fields = {
        "deterministic": True,
        "experimental_external_state_policy": ExternalStatePolicy.WARN,
        "experimental_distribute": None,
    }

    def __init__(self) -> None:
        super().__init__()
        self._values["experimental_distribute"] = DistributeOptions()

    def _check(self, name: str, value: Any) -> Any:
        if name == "deterministic" and not isinstance(value, bool):
            raise InvalidArgumentValueError(f"deterministic must be a bool, got {value!r}")
        if name == "experimental_external_state_policy" and not isinstance(
            value, ExternalStatePolicy
        ):
            raise InvalidArgumentValueError(
                "experimental_external_state_policy must be a "
                f"sluice.data.experimental.ExternalStatePolicy, got {value!r}"
            )
        if name == "experimental_distribute" and not isinstance(value, DistributeOptions):
            raise InvalidArgumentValueError(
                f"experimental_distribute must be a DistributeOptions, got {value!r}"
            )
        return value

    def merge(self, other: "Options") -> "Options":
        """These options with the fields set in ``other`` replaced (tf.data's merge)."""
        if not isinstance(other, Options):
            raise InvalidArgumentValueError(
                f"options must be a sluice.data.Options, got {type(other).__name__}"
            )
        merged = Options()
        for source in (self, other):
            for name, value in source._values.items():
                if name != "experimental_distribute":
                    merged._values[name] = value
            for name, value in source.experimental_distribute._values.items():
                merged.experimental_distribute._values[name] = value
        return merged

    def _codes(self) -> "tuple[Optional[bool], int, int]":
        """The definition's form: (deterministic or None, external state code, shard code)."""
        deterministic = self._values.get("deterministic")
        esp = self._values.get("experimental_external_state_policy")
        asp = self.experimental_distribute._values.get("auto_shard_policy")
        return (
            deterministic,
            0 if esp is None else _EXTERNAL_STATE_CODES[esp],
            0 if asp is None else _AUTO_SHARD_CODES[asp],
        )

    @staticmethod
    def _from_codes(codes: "tuple[Optional[bool], int, int]") -> "Options":
        deterministic, esp, asp = codes
        o = Options()
        if deterministic is not None:
            o.deterministic = deterministic
        for policy, code in _EXTERNAL_STATE_CODES.items():
            if code == esp:
                o.experimental_external_state_policy = policy
        for shard_policy, code in _AUTO_SHARD_CODES.items():
            if code == asp:
                o.experimental_distribute.auto_shard_policy = shard_policy
        return o
