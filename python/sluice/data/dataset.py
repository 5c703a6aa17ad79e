"""``Dataset``: tf.data's builder and iteration over a native Sluice pipeline."""

from __future__ import annotations

import atexit
import glob as _glob
import os as _os
import threading
import weakref
from typing import Any, Callable, Iterator, List, Mapping, Optional, Sequence, Union

import numpy as np

from sluice import _functions, _native
from sluice.data import _padding
from sluice._tensors import tensor_parts as _tensor_parts
from sluice.data.options import Options
from sluice.data.tensor_spec import TensorSpec
from sluice.errors import InvalidArgumentError, InvalidArgumentValueError, OpError

# Epochs not yet ended. A reader that exits mid-epoch closes them on the way out, so the
# dispatcher hears at once that its clients are gone (as tf.data's iterators release theirs
# when destroyed) instead of after the client timeout: a deleted iterator releases its client
# by itself, but at exit the runtime that would send the release may stop first.
_live_epochs: "weakref.WeakSet[_native.Iterator]" = weakref.WeakSet()


@atexit.register
def _close_live_epochs() -> None:
    # All at once: each close waits (a bounded time) for the dispatcher to hear, and one after
    # another they added up when it was gone (each epoch its own wait).
    def close(epoch: "_native.Iterator") -> None:
        try:
            epoch.close()
        except OpError:
            pass  # exiting: a release that fails falls to the dispatcher's client timeout

    closing = [
        threading.Thread(target=close, args=(epoch,), name="sluice-close", daemon=True)
        for epoch in list(_live_epochs)
    ]
    for thread in closing:
        thread.start()
    for thread in closing:
        thread.join()


AUTOTUNE = -1
"""tf.data's ``AUTOTUNE``, accepted by :meth:`Dataset.prefetch`."""

# tf.data's SHARD_HINT (exported by `sluice.data.experimental`).
_SHARD_HINT = -1

# Elements ``prefetch(AUTOTUNE)`` buffers.
_AUTOTUNE_PREFETCH = 16

Element = Any
"""A numpy scalar, a numpy array, ``bytes``, or a tuple or dict of elements."""


class Dataset:
    """A pipeline: a source and ops, as in tf.data.

    Build one with :meth:`range`, :meth:`from_tensor_slices`, :meth:`list_files`,
    :func:`TFRecordDataset` or :func:`TextLineDataset`, chain ops, and iterate it::

        >>> from sluice.data import Dataset
        >>> [int(x) for x in Dataset.range(10).filter("is_even").skip(1).take(2)]
        [2, 4]

    Iterating a dataset runs it here; ``dataset.apply(sluice.distribute(...))`` reads it from
    the service instead, and each ``iter()`` of that dataset is a new epoch.
    """

    __slots__ = ("_native", "_files", "_options")

    def __init__(
        self,
        native: _native.Dataset,
        files: Optional[List[str]] = None,
        options: Optional[Options] = None,
    ) -> None:
        self._native = native
        # The file names of a `list_files` dataset, for TFRecordDataset/TextLineDataset.
        self._files = files
        # What `with_options` set so far (carried in a local definition too).
        self._options = options

    # Sources.

    @staticmethod
    def range(*args: int) -> "Dataset":
        """``range(stop)``, ``range(start, stop)`` or ``range(start, stop, step)`` as int64.

        >>> [int(x) for x in Dataset.range(1, 7, 2).as_numpy_iterator()]
        [1, 3, 5]
        """
        if not 1 <= len(args) <= 3:
            raise InvalidArgumentError(f"range takes 1 to 3 arguments, got {len(args)}")
        start, stop, step = (0, args[0], 1) if len(args) == 1 else (args + (1,))[:3]
        return Dataset(_native.Dataset.range(int(start), int(stop), int(step)))

    @staticmethod
    def random(
        seed: Optional[int] = None,
        rerandomize_each_iteration: Optional[bool] = None,
        name: Optional[str] = None,
    ) -> "Dataset":
        """Pseudo-random ``int64`` scalars without end, as tf.data's ``Dataset.random``.

        With a ``seed`` every iteration yields the same stream (tf.data's default); without
        one each iteration draws its own. The stream is Sluice's own (SplitMix64), not
        TensorFlow's: the same seed gives other numbers than in tf.data::

            >>> a = list(Dataset.random(seed=4).take(3).as_numpy_iterator())
            >>> a == list(Dataset.random(seed=4).take(3).as_numpy_iterator())
            True
            >>> Dataset.random().cardinality()
            -1

        It has no splits: ``distributed_epoch`` refuses it (as tf.data service does, having
        no split provider for it); ``parallel_epochs`` gives each worker its own stream.
        """
        del name
        if rerandomize_each_iteration and seed is not None:
            raise InvalidArgumentError(
                "random(seed=..., rerandomize_each_iteration=True) is not supported: a seeded "
                "stream is the same on every iteration; leave the seed out for fresh draws"
            )
        if seed is not None and not 0 <= int(seed) < 2**64:
            raise InvalidArgumentError(f"`seed` must be between 0 and 2**64 - 1, got {seed}")
        return Dataset(_native.Dataset.random(None if seed is None else int(seed)))

    @staticmethod
    def from_tensor_slices(tensors: Any) -> "Dataset":
        """The slices of ``tensors`` along its first dimension.

        ``tensors`` is a numpy array or anything ``numpy.asarray`` takes (a list, nested lists,
        strings become ``bytes``), or a tuple or dict (nested) of them, sliced together: every
        array's first dimension must be the same, and each element has ``tensors``' structure
        (dict keys are strings; elements list them in sorted order)::

            >>> list(Dataset.from_tensor_slices([[1, 2], [3, 4]]).as_numpy_iterator())
            [array([1, 2]), array([3, 4])]
            >>> list(Dataset.from_tensor_slices(["a", "b"]).as_numpy_iterator())
            [b'a', b'b']
            >>> ds = Dataset.from_tensor_slices(([1, 2], {"y": ["a", "b"]}))
            >>> [(int(x), d) for x, d in ds]
            [(1, {'y': b'a'}), (2, {'y': b'b'})]
        """
        if isinstance(tensors, _Element):
            return Dataset(_native.Dataset.element_slices())
        if isinstance(tensors, (tuple, dict)):
            return Dataset(_native.Dataset.from_structured_slices(_columns(tensors)))
        dtype, shape, data = _tensor_parts(tensors)
        return Dataset(_native.Dataset.from_slices(dtype, shape, data))

    @staticmethod
    def from_tensors(tensors: Any, name: Optional[str] = None) -> "Dataset":
        """One element: ``tensors`` itself (an array or anything ``numpy.asarray`` takes, or a
        tuple or dict of them, nested), as tf.data's ``from_tensors``::

            >>> list(Dataset.from_tensors([1, 2]).as_numpy_iterator())
            [array([1, 2])]
            >>> [(int(a), d) for a, d in Dataset.from_tensors((7, {"b": "x"}))]
            [(7, {'b': b'x'})]

        ``Dataset.from_tensors(x).repeat()`` is the usual endless companion of another dataset
        in :meth:`zip`.
        """
        del name
        return Dataset(_native.Dataset.from_tensors(_columns(tensors)))

    @staticmethod
    def zip(*args: Any, datasets: Any = None, name: Optional[str] = None) -> "Dataset":
        """Element ``i`` is the structure of the datasets' elements ``i``: ``zip(a, b)`` or
        ``zip((a, b))`` gives tuples, ``zip({"x": a, "y": b})`` dicts, and structures nest
        (``zip((a, (b, c)))``). It ends with the shortest dataset, as tf.data's::

            >>> ds = Dataset.zip(Dataset.range(3), Dataset.range(10, 20))
            >>> [(int(a), int(b)) for a, b in ds]
            [(0, 10), (1, 11), (2, 12)]
            >>> [{k: int(v) for k, v in d.items()}
            ...  for d in Dataset.zip({"x": Dataset.range(2), "y": Dataset.range(5, 7)})]
            [{'x': 0, 'y': 5}, {'x': 1, 'y': 6}]
        """
        del name
        if args and datasets is not None:
            raise TypeError("Both `*args` and `datasets` cannot be set.")
        if len(args) == 1:
            datasets = args[0]
        elif args:
            datasets = args
        if datasets is None:
            raise TypeError("Must pass at least one dataset to `zip`.")
        return _zip_structure(datasets)

    @staticmethod
    def sample_from_datasets(
        datasets: Sequence["Dataset"],
        weights: Optional[Sequence[float]] = None,
        seed: Optional[int] = None,
        stop_on_empty_dataset: bool = False,
        rerandomize_each_iteration: Optional[bool] = None,
    ) -> "Dataset":
        """Each element is the next one of a dataset drawn at random, with probability
        proportional to its weight (equal weights by default). A dataset that ends is left out
        of later draws; with ``stop_on_empty_dataset`` the first one that ends ends this one.
        A ``seed`` fixes the draws; each epoch (or pass of a ``repeat``) draws anew::

            >>> ds = Dataset.sample_from_datasets(
            ...     [Dataset.range(3), Dataset.range(10, 13)], weights=[1.0, 0.0], seed=1)
            >>> [int(x) for x in ds]
            [0, 1, 2]

        The datasets' element specs must be compatible (same structure and dtypes);
        ``weights`` is a list of non-negative numbers, one per dataset (a dataset of weights
        is not supported).
        """
        del rerandomize_each_iteration  # every pass draws anew
        inputs = _dataset_list(datasets)
        if weights is not None:
            if isinstance(weights, Dataset):
                raise InvalidArgumentError(
                    "sample_from_datasets: `weights` as a Dataset is not supported; pass a list"
                )
            weights = [float(w) for w in np.asarray(weights, dtype=np.float64).reshape(-1)]
            if len(weights) != len(inputs):
                raise ValueError(
                    "Invalid `weights`. `weights` should have the same length as `datasets` "
                    f"but got `len(weights)={len(weights)}` vs. `len(datasets)={len(inputs)}`."
                )
        return _incompatible_as_type_error(
            lambda: _native.Dataset.sample_from_datasets(
                [d._native for d in inputs],
                weights,
                None if seed is None else int(seed) % 2**64,
                bool(stop_on_empty_dataset),
            )
        )

    @staticmethod
    def choose_from_datasets(
        datasets: Sequence["Dataset"],
        choice_dataset: "Dataset",
        stop_on_empty_dataset: bool = True,
    ) -> "Dataset":
        """Each element of ``choice_dataset`` (int64 scalars) picks the dataset whose next
        element comes next. With ``stop_on_empty_dataset`` (the default) a pick of a dataset
        that ended ends this one; without it, such picks are skipped::

            >>> choice = Dataset.range(3).repeat(2)
            >>> ds = Dataset.choose_from_datasets(
            ...     [Dataset.from_tensors(b"a").repeat(), Dataset.from_tensors(b"b").repeat(),
            ...      Dataset.from_tensors(b"c").repeat()], choice)
            >>> list(ds)
            [b'a', b'b', b'c', b'a', b'b', b'c']

        A choice outside ``[0, len(datasets))`` fails the epoch with
        :class:`~sluice.errors.InvalidArgumentError`.
        """
        inputs = _dataset_list(datasets)
        if not isinstance(choice_dataset, Dataset):
            raise TypeError(
                "Invalid `choice_dataset`. `choice_dataset` should be a `tf.data.Dataset` but "
                f"is {type(choice_dataset)}."
            )
        spec = choice_dataset.element_spec
        if not (
            isinstance(spec, TensorSpec) and tuple(spec.shape) == () and str(spec.dtype) == "int64"
        ):
            raise TypeError(
                "Invalid `choice_dataset`. Elements of `choice_dataset` must be scalar of type "
                "`tf.int64`."
            )
        return _incompatible_as_type_error(
            lambda: _native.Dataset.choose_from_datasets(
                [d._native for d in inputs], choice_dataset._native, bool(stop_on_empty_dataset)
            )
        )

    @staticmethod
    def from_generator(
        generator: Callable[..., Any],
        output_types: Any = None,
        output_shapes: Any = None,
        args: Optional[Sequence[Any]] = None,
        output_signature: Any = None,
    ) -> "Dataset":
        """The elements a Python generator yields, as tf.data's ``from_generator``:
        ``generator(*args)`` returns an iterable (a generator function's call, a list, ...),
        read as it goes; each pass of a ``repeat`` calls it again.

            >>> def count(n):
            ...     yield from range(n)
            >>> ds = Dataset.from_generator(count, args=(3,),
            ...                             output_signature=TensorSpec((), "int64"))
            >>> [int(x) for x in ds]
            [0, 1, 2]

        The element spec is ``output_signature`` (``TensorSpec`` leaves), or ``output_types``
        with ``output_shapes`` (both structures alike); with ``output_types`` alone it is the
        first element's. Through the service the generator runs on the workers' Python
        executors (pickled with cloudpickle, as :meth:`map`'s function), in
        ``parallel_epochs`` mode only: a generator's elements are one sequence that cannot be
        split, so ``distributed_epoch`` and the static sharding modes refuse it.
        """
        if not callable(generator):
            raise TypeError("`generator` must be a Python callable.")
        if output_signature is not None:
            if output_types is not None:
                raise TypeError(
                    "The `output_types` argument can not be used together with the "
                    "`output_signature` argument."
                )
            if output_shapes is not None:
                raise TypeError(
                    "The `output_shapes` argument can not be used together with the "
                    "`output_signature` argument."
                )
            signature = output_signature
        elif output_types is None:
            raise TypeError(
                "To specify the output signature you need to provide either the "
                "`output_signature` argument or the `output_types` argument."
            )
        elif output_shapes is None:
            signature = None
        else:
            signature = _signature_of(output_types, output_shapes)
        call_args = tuple(np.asarray(a) if isinstance(a, (list, tuple)) else a for a in args or ())
        fn = _functions.Generator(generator, call_args)
        return Dataset.range(1)._py_function(_functions.KIND_GENERATOR, fn, 0, signature)

    @staticmethod
    def list_files(
        file_pattern: Union[str, Sequence[str]],
        shuffle: Optional[bool] = None,
        seed: Optional[int] = None,
    ) -> "Dataset":
        """The names (``bytes``) of the files matching ``file_pattern`` (a glob, or several).

        As in tf.data the names are shuffled unless ``shuffle=False``. Fails with
        :class:`~sluice.errors.InvalidArgumentError` when nothing matches.
        """
        patterns = [file_pattern] if isinstance(file_pattern, str) else list(file_pattern)
        files = sorted({f for p in patterns for f in _matching_files(p)})
        if not files:
            raise InvalidArgumentError(
                f"Expected 'file_pattern' argument to match at least one file, got {file_pattern!r}"
            )
        # A files source of names: a server shards it by file (FILE sharding) and splits it per
        # file (distributed_epoch), as tf.data does its list_files.
        names = Dataset(_native.Dataset.files(",".join(files), "names", files, None), files)
        if shuffle is None or shuffle:
            names = Dataset(names._native.shuffle(len(files), seed), files)
        return names

    # Ops.

    def map(
        self,
        map_func: Union[str, Callable[..., Any]],
        num_parallel_calls: Optional[int] = None,
        deterministic: Optional[bool] = None,
        output_signature: Any = None,
    ) -> "Dataset":
        """Applies ``map_func`` to every element: any Python callable (a lambda, a closure, a
        function of your own module, a callable object), or the name of a built-in function
        (``"square"``, ...), which runs natively.

        The function takes and returns numpy values; a tuple element is passed as positional
        arguments, as in tf.data. It returns an element: a numpy array or scalar, a Python
        number, ``bytes``, or a tuple or dict of them::

            >>> [int(x) for x in Dataset.range(4).map(lambda x: x * 10)]
            [0, 10, 20, 30]
            >>> ds = Dataset.from_tensor_slices(([1, 2], [3, 4])).map(lambda a, b: a + b)
            >>> [int(x) for x in ds]
            [4, 6]

        Before :func:`sluice.distribute` the function runs on the workers, in their Python
        executor processes; after it, or when the dataset is iterated here, in this
        interpreter. It travels pickled with cloudpickle, once per op: your own modules go by
        value, so workers need not have them; installed packages (numpy, ...) go by reference
        and must be installed on the workers, with the same Python minor version and
        cloudpickle version as here (a worker refuses the task otherwise, naming both).

        ``num_parallel_calls``: how many calls may run at once; ``None`` or ``AUTOTUNE`` let
        the runner decide (a worker runs as many as it has executors). Outputs keep the input
        order whatever ``deterministic`` says. ``output_signature``: the output's element
        spec (:class:`TensorSpec` leaves in tuples and dicts); without it, the spec is known
        from the first element (see :attr:`element_spec`). A function that raises ends the
        epoch with :class:`sluice.errors.PythonFunctionError`, which is also an instance of
        the original class when that is a built-in one.

        >>> [int(x) for x in Dataset.range(4).map("square").as_numpy_iterator()]
        [0, 1, 4, 9]
        """
        del deterministic  # outputs are always in input order
        if isinstance(map_func, str):
            return self._chain(self._native.map(map_func))
        parallel = _parallel_calls(num_parallel_calls)
        return self._py_function(_functions.KIND_MAP, map_func, parallel, output_signature)

    def filter(self, predicate: Union[str, Callable[..., Any]]) -> "Dataset":
        """Keeps the elements for which ``predicate`` holds: a Python callable returning a bool
        (or a scalar that converts to one), or the name of a built-in predicate. Where it runs
        and how it travels is as for :meth:`map`.

        >>> [int(x) for x in Dataset.range(6).filter(lambda x: x % 3 == 0)]
        [0, 3]
        >>> [int(x) for x in Dataset.range(6).filter("is_odd").as_numpy_iterator()]
        [1, 3, 5]
        """
        if isinstance(predicate, str):
            return self._chain(self._native.filter(predicate))
        return self._py_function(_functions.KIND_FILTER, predicate, 0, None)

    def flat_map(self, map_func: Callable[..., Any], output_signature: Any = None) -> "Dataset":
        """Replaces each element by the elements of what ``map_func`` returns: a
        :class:`Dataset` or any iterable (a list, a numpy array's rows). Where it runs and how
        it travels is as for :meth:`map`.

        >>> ds = Dataset.range(1, 4).flat_map(lambda n: Dataset.range(int(n)))
        >>> [int(x) for x in ds]
        [0, 0, 1, 0, 1, 2]
        >>> [int(x) for x in Dataset.range(2).flat_map(lambda x: [x, x])]
        [0, 0, 1, 1]
        """
        return self._py_function(_functions.KIND_FLAT_MAP, map_func, 0, output_signature)

    def interleave(
        self,
        map_func: Callable[..., Any],
        cycle_length: Optional[int] = None,
        block_length: Optional[int] = None,
        num_parallel_calls: Optional[int] = None,
        deterministic: Optional[bool] = None,
        output_signature: Any = None,
    ) -> "Dataset":
        """Maps each element to a dataset with ``map_func`` and interleaves them, as tf.data:
        ``cycle_length`` of them are open at once and read in turn, ``block_length`` elements
        from each (1 by default); an exhausted one is replaced by the next element's. It is the
        way to read many files at once::

            >>> files = Dataset.list_files("/data/*.tfrecord")       # doctest: +SKIP
            >>> ds = files.interleave(TFRecordDataset, cycle_length=4,
            ...                       num_parallel_calls=AUTOTUNE)  # doctest: +SKIP
            >>> ds = Dataset.from_tensor_slices([[1, 2, 3], [4, 5, 6]]).interleave(
            ...     Dataset.from_tensor_slices, cycle_length=2)
            >>> [int(x) for x in ds]
            [1, 4, 2, 5, 3, 6]

        ``cycle_length`` ``None`` or ``AUTOTUNE`` is the machine's CPU count, as in tf.data.
        With ``num_parallel_calls`` (a number, or ``AUTOTUNE`` for ``cycle_length`` of them)
        the open datasets are read ahead concurrently, each by its own thread; without it they
        are read one after another. The order is tf.data's deterministic one either way
        (``deterministic`` is accepted and changes nothing), so the output depends only on the
        input's order, which exactly-once delivery needs.

        ``map_func`` is called once here with a placeholder for the element. When it returns a
        dataset built from it with this package's sources (``TFRecordDataset(f)``,
        ``TextLineDataset(f)``, ``Dataset.from_tensor_slices(x)``, then any ops), that
        dataset is the template every element's inner dataset is made from, and a worker runs
        it natively, without Python. Otherwise (the function does something else with the
        element, or takes a tuple element's parts) it runs per element as a Python function,
        as :meth:`flat_map` does, each call's dataset or iterable read whole into memory;
        ``output_signature`` then gives its element spec.
        """
        del deterministic  # the order is always the deterministic one
        if not callable(map_func):
            raise InvalidArgumentError(
                f"interleave takes a Python callable, got {type(map_func).__name__}"
            )
        cycle = 0 if cycle_length is None or cycle_length == AUTOTUNE else cycle_length
        if cycle_length is not None and cycle_length != AUTOTUNE and cycle <= 0:
            raise InvalidArgumentError("cycle_length must be greater than zero.")
        block = 1 if block_length is None else block_length
        if block <= 0:
            raise InvalidArgumentError("block_length must be greater than zero.")
        if num_parallel_calls is None:
            parallel: Optional[int] = None
        elif num_parallel_calls == AUTOTUNE:
            parallel = 0
        elif num_parallel_calls <= 0:
            raise InvalidArgumentError(
                "num_parallel_calls must be greater than zero or AUTOTUNE, got "
                f"{num_parallel_calls}"
            )
        else:
            parallel = int(num_parallel_calls)
        template = _trace(map_func)
        if template is not None:
            return self._chain(
                self._native.interleave(template._native, int(cycle), int(block), parallel)
            )
        if output_signature is not None:
            _check_signature(output_signature)
        p = self._pickled(_functions.KIND_INTERLEAVE, map_func)
        return self._chain(
            self._native.py_interleave(
                p.pickled,
                p.name,
                p.python_version,
                p.cloudpickle_version,
                int(cycle),
                int(block),
                parallel,
                output_signature,
            )
        )

    def group_by_window(
        self,
        key_func: Union[str, Callable[..., Any]],
        reduce_func: Callable[[Any, "Dataset"], "Dataset"],
        window_size: Optional[int] = None,
        window_size_func: Optional[Callable[[Any], Any]] = None,
    ) -> "Dataset":
        """Groups elements by key and reduces each window of a group to a dataset, as
        tf.data's ``group_by_window``.

        ``key_func`` maps an element to an int64 scalar key (a Python callable, or the name of
        a built-in map function). Elements go to their key's group; when a group holds its
        window size (``window_size``, or ``window_size_func(key)``, asked once per key), it is
        handed to ``reduce_func(key, window)`` as a dataset, and the elements of the dataset it
        returns are yielded. At the end the groups left are reduced, smallest key first::

            >>> ds = Dataset.range(10).group_by_window(
            ...     lambda x: x % 2, lambda key, window: window.batch(5), window_size=5)
            >>> [b.tolist() for b in ds]
            [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]

        ``reduce_func`` is called once here with placeholders: when it returns ops applied to
        the window (``window.batch(n)``, ``window.map(f).take(1)``) without using the key, the
        worker runs them natively. Otherwise it runs in Python per window, on a dataset of the
        window's elements.
        """
        if (window_size is not None and window_size_func) or not (
            window_size is not None or window_size_func
        ):
            raise ValueError(
                "Either the `window_size` argument or the `window_size_func` argument must be "
                "specified."
            )
        if window_size is not None and window_size <= 0:
            raise InvalidArgumentError(
                f"Window size must be greater than zero, but got {window_size}."
            )
        if not callable(reduce_func):
            raise InvalidArgumentError(
                f"reduce_func must be a Python callable, got {type(reduce_func).__name__}"
            )
        key = key_func if isinstance(key_func, str) else self._pickled_parts(key_func)
        size_fn = None if window_size_func is None else self._pickled_parts(window_size_func)
        window = Dataset(_native.Dataset.element_window())
        try:
            traced = reduce_func(_Element(), window)
        except Exception:  # noqa: BLE001 - any failure means: run it as a Python function
            traced = None
        if (
            isinstance(traced, Dataset)
            and not traced._native.is_service()
            and repr(traced._native).startswith("element_window()")
        ):
            native = self._native.group_by_window(
                key, int(window_size or 0), size_fn, traced._native, None
            )
        else:
            reduce = self._pickled_parts(_functions.GroupReduce(reduce_func))
            native = self._native.group_by_window(
                key, int(window_size or 0), size_fn, None, reduce
            )
        return self._chain(native)

    def bucket_by_sequence_length(
        self,
        element_length_func: Callable[..., Any],
        bucket_boundaries: Sequence[int],
        bucket_batch_sizes: Sequence[int],
        padded_shapes: Any = None,
        padding_values: Any = None,
        pad_to_bucket_boundary: bool = False,
        no_padding: bool = False,
        drop_remainder: bool = False,
    ) -> "Dataset":
        """Batches elements of similar lengths together, as tf.data's
        ``bucket_by_sequence_length``: an element of length ``element_length_func(element)``
        goes to the bucket ``i`` with ``bucket_boundaries[i-1] <= length <
        bucket_boundaries[i]``, and each bucket is batched by ``bucket_batch_sizes[i]``
        (``len(bucket_boundaries) + 1`` of them), its components padded to the longest in the
        batch (or ``padded_shapes``; ``None`` dimensions there are the longest, or the bucket's
        boundary minus 1 with ``pad_to_bucket_boundary``) with ``padding_values`` (0 and
        ``b""`` by default); ``no_padding`` stacks them as they are.

            >>> ds = Dataset.from_generator(
            ...     lambda: (np.arange(n) for n in [1, 5, 2, 6]),
            ...     output_signature=TensorSpec((None,), "int64"))
            >>> [b.tolist() for b in ds.bucket_by_sequence_length(len, [4], [2, 2])]
            [[[0, 0], [0, 1]], [[0, 1, 2, 3, 4, 0], [0, 1, 2, 3, 4, 5]]]

        It is ``group_by_window`` with Python functions: they run on the workers' Python
        executors (or here).
        """
        boundaries = [int(b) for b in bucket_boundaries]
        sizes = [int(b) for b in bucket_batch_sizes]
        if len(sizes) != len(boundaries) + 1:
            raise ValueError(
                "`len(bucket_batch_sizes)` must equal `len(bucket_boundaries) + 1` but "
                f"`len(bucket_batch_sizes)={len(sizes)}` and "
                f"`len(bucket_boundaries)={len(boundaries)}`."
            )
        if any(b <= 0 for b in sizes):
            raise InvalidArgumentError("bucket_batch_sizes must be positive")
        if sorted(boundaries) != boundaries:
            raise InvalidArgumentError("bucket_boundaries must be sorted in increasing order")
        bucket = _padding.BucketOf(element_length_func, boundaries)
        batch = _padding.BucketBatch(
            sizes, boundaries, padded_shapes, padding_values, pad_to_bucket_boundary,
            no_padding, drop_remainder,
        )
        native = self._native.group_by_window(
            self._pickled_parts(bucket),
            0,
            self._pickled_parts(_padding.BucketSize(sizes)),
            None,
            self._pickled_parts(batch),
        )
        return self._chain(native)

    def _pickled_parts(self, fn: Any) -> Any:
        p = self._pickled(_functions.KIND_MAP, fn)
        return (p.pickled, p.name, p.python_version, p.cloudpickle_version)

    def take_while(self, predicate: Union[str, Callable[..., Any]]) -> "Dataset":
        """The elements before the first one for which ``predicate`` is false, as tf.data's
        ``take_while``: a Python callable returning a scalar bool, or the name of a built-in
        predicate. Where it runs and how it travels is as for :meth:`filter`.

        >>> [int(x) for x in Dataset.range(10).take_while(lambda x: x < 3)]
        [0, 1, 2]
        >>> [int(x) for x in Dataset.range(5).take_while("is_even")]
        [0]
        """
        if isinstance(predicate, str):
            return self._chain(self._native.take_while(predicate))
        return self._py_function(_functions.KIND_TAKE_WHILE, predicate, 0, None)

    def _pickled(self, kind: int, fn: Any) -> "_functions.Pickled":
        try:
            return _functions.pickle_function(fn)
        except Exception as e:
            raise InvalidArgumentError(
                f"{_functions.KIND_NAMES[kind]}: cannot pickle {_functions.function_name(fn)} "
                f"with cloudpickle: {type(e).__name__}: {e}"
            ) from e

    def _py_function(
        self, kind: int, fn: Any, num_parallel_calls: int, output_signature: Any
    ) -> "Dataset":
        op = _functions.KIND_NAMES[kind]
        if not callable(fn):
            raise InvalidArgumentError(
                f"{op} takes a Python callable or the name of a built-in function, got "
                f"{type(fn).__name__}"
            )
        if output_signature is not None:
            _check_signature(output_signature)
        try:
            p = _functions.pickle_function(fn)
        except Exception as e:
            raise InvalidArgumentError(
                f"{op}: cannot pickle {_functions.function_name(fn)} with cloudpickle: "
                f"{type(e).__name__}: {e}"
            ) from e
        return self._chain(
            self._native.py_function(
                kind,
                p.pickled,
                p.name,
                p.python_version,
                p.cloudpickle_version,
                num_parallel_calls,
                output_signature,
            )
        )

    def batch(self, batch_size: int, drop_remainder: bool = False) -> "Dataset":
        """Stacks ``batch_size`` consecutive elements into one.

        >>> list(Dataset.range(5).batch(2, drop_remainder=True).as_numpy_iterator())
        [array([0, 1]), array([2, 3])]
        """
        return self._chain(self._native.batch(_positive(batch_size, "batch_size"), drop_remainder))

    def shuffle(
        self,
        buffer_size: int,
        seed: Optional[int] = None,
        reshuffle_each_iteration: Optional[bool] = None,
    ) -> "Dataset":
        """Shuffles with a buffer of ``buffer_size`` elements (a fixed ``seed`` repeats).

        >>> sorted(int(x) for x in Dataset.range(5).shuffle(5, seed=1))
        [0, 1, 2, 3, 4]
        """
        del reshuffle_each_iteration  # each epoch reshuffles unless seeded, as in tf.data
        return self._chain(self._native.shuffle(_positive(buffer_size, "buffer_size"), seed))

    def repeat(self, count: Optional[int] = None) -> "Dataset":
        """Repeats ``count`` times; ``None`` or ``-1`` forever.

        >>> [int(x) for x in Dataset.range(2).repeat(2).as_numpy_iterator()]
        [0, 1, 0, 1]
        """
        forever = count is None or count < 0
        return self._chain(self._native.repeat(None if forever else int(count)))  # type: ignore[arg-type]

    def take(self, count: int) -> "Dataset":
        """The first ``count`` elements; ``-1`` all of them.

        >>> [int(x) for x in Dataset.range(10).take(3).as_numpy_iterator()]
        [0, 1, 2]
        """
        return self if count < 0 else self._chain(self._native.take(int(count)))

    def skip(self, count: int) -> "Dataset":
        """All but the first ``count`` elements; ``-1`` skips everything.

        >>> [int(x) for x in Dataset.range(5).skip(3).as_numpy_iterator()]
        [3, 4]
        """
        n = 2**64 - 1 if count < 0 else int(count)
        return self._chain(self._native.skip(n))

    def shard(self, num_shards: int, index: int, name: Optional[str] = None) -> "Dataset":
        """Every ``num_shards``-th element, starting at ``index``.

        >>> [int(x) for x in Dataset.range(7).shard(3, 1).as_numpy_iterator()]
        [1, 4]

        ``num_shards`` may be ``sluice.data.experimental.SHARD_HINT`` (then ``index`` is not
        used, as in tf.data): a placeholder that the ``HINT`` auto-shard policy (of the
        service's ``ShardingPolicy.HINT``, or of a distribute strategy) replaces by
        ``shard(num_workers, worker_index)``. A pipeline that runs with the placeholder left
        in place fails. Bad arguments raise tf.data's texts::

            >>> try:
            ...     Dataset.range(7).shard(0, 0)
            ... except ValueError as e:
            ...     print(e)
            Number of shards must be greater than zero (currently num_shards = 0).
        """
        del name
        num_shards, index = int(num_shards), int(index)
        if num_shards == _SHARD_HINT:
            return self._chain(self._native.shard_hint())
        if num_shards <= 0:
            raise InvalidArgumentValueError(
                f"Number of shards must be greater than zero (currently num_shards = {num_shards})."
            )
        if not 0 <= index < num_shards:
            raise InvalidArgumentValueError(
                f"Index must be between 0 and {num_shards - 1} (currently index = {index})."
            )
        return self._chain(self._native.shard(num_shards, index))

    def padded_batch(
        self,
        batch_size: int,
        padded_shapes: Any = None,
        padding_values: Any = None,
        drop_remainder: bool = False,
        name: Optional[str] = None,
    ) -> "Dataset":
        """Batches ``batch_size`` elements, each component first padded to a common shape, as
        tf.data's ``padded_batch``.

        ``padded_shapes`` has the element's structure (tuples and dicts of shapes; a shape is
        a list of sizes, ``None`` or ``-1`` for "the batch's largest"); ``None`` pads every
        dimension to the batch's largest. A component larger than its given size fails
        (naming both shapes). ``padding_values`` has the element's structure too, one scalar
        per component (a Python number or string takes the component's dtype; a numpy value
        must have it); ``None`` pads with 0, ``False`` or ``b""``::

            >>> ds = Dataset.range(1, 4).map(lambda n: np.arange(n))
            >>> [b.tolist() for b in ds.padded_batch(2)]
            [[[0, 0], [0, 1]], [[0, 1, 2]]]
            >>> [b.tolist() for b in ds.padded_batch(3, padded_shapes=[4], padding_values=-1)]
            [[[0, -1, -1, -1], [0, 1, -1, -1], [0, 1, 2, -1]]]

        A padded component larger than 4 GiB per batch is refused (before anything is
        allocated), and the batch being built counts against a worker's memory budget.
        """
        del name
        size = _positive(batch_size, "batch_size")
        # Only given shapes or values need the spec (which, for a Python function's output
        # without a signature, takes an element).
        spec = None if padded_shapes is None and padding_values is None else self.element_spec
        leaves = _spec_leaves(spec)
        shapes: List[List[int]] = []
        if padded_shapes is not None:
            given = _flatten_up_to(spec, padded_shapes, "padded_shapes")
            shapes = [_padded_shape(s, i) for i, s in enumerate(given)]
        values: List[Any] = []
        if padding_values is not None:
            given = _flatten_up_to(spec, padding_values, "padding_values")
            values = [_padding_value(v, leaf) for v, leaf in zip(given, leaves)]
        return self._checked(self._native.padded_batch(size, bool(drop_remainder), shapes, values))

    def unbatch(self, name: Optional[str] = None) -> "Dataset":
        """Splits each element into the rows of its first dimension, which every component
        must share (tf.data's ``unbatch``; a scalar component is an error).

        >>> [int(x) for x in Dataset.range(5).batch(2).unbatch()]
        [0, 1, 2, 3, 4]
        """
        del name
        return self._checked(self._native.unbatch())

    def ignore_errors(self, log_warning: bool = False, name: Optional[str] = None) -> "Dataset":
        """Drops the elements whose computation failed (a Python function that raised, a
        corrupt record, ...) and goes on, as tf.data's ``ignore_errors``; with
        ``log_warning`` each dropped error is logged (on the worker that ran it).

        Unlike tf.data, which drops every error, errors that mean the pipeline itself cannot
        go on still end it: cancellation, a worker's memory budget, its link to the
        dispatcher, a missing or broken Python executor, a file outside a server's data
        roots::

            >>> ds = Dataset.range(5).map(lambda x: 10 // int(x - 2)).ignore_errors()
            >>> [int(x) for x in ds]
            [-5, -10, 10, 5]
        """
        del name
        return self._chain(self._native.ignore_errors(bool(log_warning)))

    def cache(self, filename: Any = "", name: Optional[str] = None) -> "Dataset":
        """Keeps the elements of the first complete pass and replays them on later passes
        (a ``repeat`` after the cache), as tf.data's ``cache``.

        ``filename`` ``""`` keeps them in memory (on a worker, against its memory budget);
        a path writes them to that file, only once a pass has ended (an interrupted pass
        leaves no file), and a pass that finds the file reads it instead, also in a later
        run. On a worker the file must be inside the worker's data roots. A cache cannot run
        before ``distribute`` in ``distributed_epoch`` mode (it would replay one worker's
        splits): apply it after ``distribute`` there.

        >>> ds = Dataset.range(3).map(lambda x: x * 2).cache().repeat(2)
        >>> [int(x) for x in ds]
        [0, 2, 4, 0, 2, 4]
        """
        del name
        return self._chain(self._native.cache(_os.fspath(filename)))

    def snapshot(
        self,
        path: Any,
        compression: Optional[str] = "AUTO",
        reader_func: Optional[Callable[..., Any]] = None,
        shard_func: Optional[Callable[..., Any]] = None,
        name: Optional[str] = None,
    ) -> "Dataset":
        """Keeps the first complete pass in the directory ``path`` and reads it on every
        later pass, in this run or a later one, as tf.data's ``snapshot``.

        The pass is written to one file in ``path`` named by the fingerprint of the dataset
        before the snapshot, only once the pass has ended, so several pipelines can share a
        directory and an interrupted pass leaves nothing. On a worker ``path`` must be inside
        the worker's data roots, and each worker keeps its own (a static shard is a dataset of
        its own). A snapshot is one sequence, not splits: ``distributed_epoch`` refuses it
        with :class:`~sluice.errors.UnimplementedError`, as tf.data does. ``compression`` is
        accepted and changes nothing (Sluice's file format is its own); ``reader_func`` and
        ``shard_func`` (tf.data's ways to lay the files out) are not supported.

        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     first = [int(x) for x in Dataset.range(3).snapshot(d)]
        ...     again = [int(x) for x in Dataset.range(3).snapshot(d)]
        >>> first, again
        ([0, 1, 2], [0, 1, 2])
        """
        del compression, name
        if reader_func is not None or shard_func is not None:
            raise InvalidArgumentError(
                "snapshot: `reader_func` and `shard_func` are not supported; a snapshot is one "
                "file per pipeline in `path`"
            )
        return self._chain(self._native.snapshot(_os.fspath(path)))

    def with_options(self, options: Options, name: Optional[str] = None) -> "Dataset":
        """This dataset with ``options`` (a :class:`sluice.data.Options`) merged into its
        own: fields set in ``options`` win, as tf.data merges them. They travel in the
        definition; see :class:`~sluice.data.Options` for what each does here."""
        del name
        merged = self.options().merge(options)
        native = self._native.with_options(*merged._codes())
        return Dataset(native, self._files, merged)

    def options(self) -> Options:
        """The options set on this dataset (tf.data's defaults for fields never set)."""
        if self._options is not None:
            return self._options.merge(Options())
        codes = self._native.def_options()
        return Options() if codes is None else Options._from_codes(codes)

    def prefetch(self, buffer_size: int) -> "Dataset":
        """Produces up to ``buffer_size`` elements ahead (``AUTOTUNE``: Sluice picks)."""
        n = _AUTOTUNE_PREFETCH if buffer_size == AUTOTUNE else _positive(buffer_size, "buffer_size")
        return self._chain(self._native.prefetch(n))

    def enumerate(self, start: int = 0) -> "Dataset":
        """Pairs each element with its index: ``(index, element)`` tuples.

        >>> [(int(i), int(x)) for i, x in Dataset.range(5, 7).enumerate()]
        [(0, 5), (1, 6)]
        """
        return self._chain(self._native.enumerate(int(start)))

    def decode_image(self, key: Optional[str] = None, channels: int = 3) -> "Dataset":
        r"""Decodes JPEG or PNG bytes to a ``uint8`` array of shape ``(height, width, channels)``.

        The element must be ``bytes``, or, with ``key``, a dict whose entry ``key`` is (the
        other entries pass through). ``channels`` is 1 (grey), 3 (RGB) or 4 (RGBA); the image
        is converted as needed. It runs natively, on the workers when it comes before
        ``distribute``. Bytes that are not a valid JPEG or PNG, or an image past 16384 pixels
        on a side or 256 MiB decoded, raise :class:`~sluice.errors.InvalidArgumentError`
        naming the op and the key::

            >>> import struct, zlib
            >>> def chunk(kind, data):
            ...     body = kind + data
            ...     return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))
            >>> ihdr = struct.pack(">IIBBBBB", 2, 1, 8, 0, 0, 0, 0)  # 2x1, 8-bit grey
            >>> png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            ...        + chunk(b"IDAT", zlib.compress(bytes([0, 16, 240]))) + chunk(b"IEND", b""))
            >>> [image] = Dataset.from_tensor_slices([png]).decode_image(channels=3)
            >>> image.shape, image.dtype, image[0].tolist()
            ((1, 2, 3), dtype('uint8'), [[16, 16, 16], [240, 240, 240]])
        """
        if channels not in (1, 3, 4):
            raise InvalidArgumentError(f"decode_image channels must be 1, 3 or 4, got {channels!r}")
        return self._chain(self._native.decode_image(_image_key(key), int(channels)))

    def resize(self, key: Optional[str] = None, size: Optional[Sequence[int]] = None) -> "Dataset":
        """Resizes ``uint8`` or ``float32`` images of shape ``(h, w, channels)`` bilinearly to
        ``size = (height, width)``; 1 to 4 channels. Shrinking is antialiased (the filter
        widens with the scale).

        The element is the image, or, with ``key``, a dict whose entry ``key`` is. ``size`` may
        also come first: ``resize((224, 224))``. Each side is between 1 and 16384::

            >>> ramp = np.array([[[0.0], [300.0]]], dtype=np.float32)  # 1x2, one channel
            >>> [out] = Dataset.from_tensor_slices(ramp[None]).resize(size=(1, 3))
            >>> out.shape, round(float(out[0, 1, 0]), 3)
            ((1, 3, 1), 150.0)
        """
        if size is None and isinstance(key, (tuple, list)):
            key, size = None, key
        if size is None:
            raise InvalidArgumentError("resize needs size=(height, width)")
        if len(size) != 2:
            raise InvalidArgumentError(f"resize size must be (height, width), got {size!r}")
        height, width = (int(s) for s in size)
        for name, side in (("height", height), ("width", width)):
            if not 1 <= side <= 16384:
                raise InvalidArgumentError(f"resize {name} must be between 1 and 16384, got {side}")
        return self._chain(self._native.resize(_image_key(key), height, width))

    def parse_example(self, features: Mapping[str, Any]) -> "Dataset":
        """Parses each element, a serialized ``tf.train.Example``, into a dict of arrays, one per
        feature: ``features`` maps names to :class:`sluice.io.FixedLenFeature` or
        :class:`sluice.io.VarLenFeature`. It runs natively (on the workers when before
        ``distribute``). A record missing a feature without a default, or holding a feature of
        another type or length, raises :class:`sluice.errors.InvalidArgumentError` naming the
        feature.

        >>> import os, tempfile
        >>> import numpy as np
        >>> from sluice.io import FixedLenFeature, TFRecordWriter, VarLenFeature
        >>> from sluice.io import serialize_example
        >>> path = os.path.join(tempfile.mkdtemp(), "a.tfrecord")
        >>> with TFRecordWriter(path) as w:
        ...     w.write(serialize_example({"label": 7, "tags": [1, 2]}))
        >>> ds = TFRecordDataset(path).parse_example(
        ...     {"label": FixedLenFeature((), np.int64), "tags": VarLenFeature(np.int64)})
        >>> element = next(iter(ds))
        >>> int(element["label"]), element["tags"].tolist()
        (7, [1, 2])
        """
        from sluice.io import _feature_parts

        if not isinstance(features, Mapping) or not features:
            raise InvalidArgumentError("`features` must be a non-empty dict of feature specs")
        parts = [_feature_parts(str(name), f) for name, f in features.items()]
        return self._chain(self._native.parse_example(parts))

    def concatenate(self, dataset: "Dataset", name: Optional[str] = None) -> "Dataset":
        """Every element of this dataset, then every element of ``dataset``. The element specs
        must be compatible (same structure and dtypes; shapes that differ become unknown
        dimensions), or :class:`TypeError` is raised, as tf.data raises it::

            >>> [int(x) for x in Dataset.range(3).concatenate(Dataset.range(10, 12))]
            [0, 1, 2, 10, 11]
        """
        del name
        if not isinstance(dataset, Dataset):
            raise TypeError(
                f"`dataset` must be a Dataset to concatenate, got {type(dataset).__name__}"
            )
        return _incompatible_as_type_error(lambda: self._native.concatenate(dataset._native))

    def apply(self, transformation_func: Callable[["Dataset"], "Dataset"]) -> "Dataset":
        """``transformation_func(self)``, e.g. ``dataset.apply(sluice.distribute(...))``."""
        result = transformation_func(self)
        if not isinstance(result, Dataset):
            raise InvalidArgumentError(
                f"`transformation_func` must return a Dataset, got {type(result).__name__}"
            )
        return result

    # Types and iteration.

    @property
    def element_spec(self) -> Any:
        """The elements' type: :class:`TensorSpec` leaves in tuples and dicts.

        The output of a Python function given no ``output_signature`` is known only from the
        first element, whose shapes it takes: a local dataset produces one element to find
        out (once per dataset object); a dataset read from the service takes it from the
        first element read, and raises :class:`~sluice.errors.FailedPreconditionError`
        before that. Give ``output_signature`` to know it up front::

            >>> Dataset.range(3).map(lambda x: (x, x * 0.5)).element_spec
            (TensorSpec(shape=(), dtype=int64), TensorSpec(shape=(), dtype=float64))
        """
        return self._native.element_spec()

    def cardinality(self) -> int:
        """The number of elements; ``-1`` infinite, ``-2`` unknown (tf's constants).

        >>> Dataset.range(10).batch(3).cardinality()
        4
        """
        return self._native.cardinality()

    def __iter__(self) -> Iterator[Element]:
        epoch = _native.Dataset.iter(self._native)
        _live_epochs.add(epoch)
        return epoch

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Makes the next ``iter()`` of this dataset resume its epoch at ``state``, a dict
        an iterator's ``state_dict()`` returned (PyTorch's convention; the dict survives
        ``torch.save``, ``pickle`` and ``json``)::

            ds = dataset.apply(sluice.distribute("distributed_epoch", service, job_name="train"))
            ds.load_state_dict(state)
            it = iter(ds)   # the epoch the state was taken in, from where it was taken

        What every reader of the job that took a state at the same step had received before
        it is not delivered again; every other element of the epoch is, once. Needs a dataset
        read through the service (``distribute`` or ``from_dataset_id``) with the state's
        ``job_name``, delivering exactly once, with no ops after ``distribute``.

        A dict with a missing, unknown or wrong-typed key raises
        :class:`~sluice.errors.InvalidArgumentValueError` naming the key, as does a state of a
        newer format or another job; a state of another dataset definition, or one the
        dispatcher no longer keeps, fails when the epoch starts (``InvalidArgumentError``,
        ``NotFoundError``). A local dataset raises
        :class:`~sluice.errors.FailedPreconditionError`.
        """
        self._native.load_state_dict(state)

    def as_numpy_iterator(self) -> Iterator[Element]:
        """An iterator of numpy values (elements already are; kept for tf.data's name)."""
        return iter(self)

    def __repr__(self) -> str:
        return f"<Dataset {self._native!r}>"

    def _chain(self, native: _native.Dataset) -> "Dataset":
        return Dataset(native, None, self._options)

    def _checked(self, native: _native.Dataset) -> "Dataset":
        """``_chain``, raising at once (as tf.data does when the op is built) what the new op's
        static spec refuses; a spec known only from elements is checked when they exist."""
        native.check_static_spec()
        return self._chain(native)


def _zip_structure(datasets: Any) -> Dataset:
    """The zip of a (nested) tuple or dict of datasets; a bare dataset is itself."""
    if isinstance(datasets, Dataset):
        return datasets
    if isinstance(datasets, tuple):
        return Dataset(_native.Dataset.zip([_zip_structure(d)._native for d in datasets], None))
    if isinstance(datasets, dict):
        for k in datasets:
            if not isinstance(k, str):
                raise TypeError(f"`zip` dict keys must be str, got {k!r}")
        return Dataset(
            _native.Dataset.zip(
                [_zip_structure(d)._native for d in datasets.values()], list(datasets)
            )
        )
    if isinstance(datasets, list):
        raise TypeError(
            "Invalid input to `zip`. Inputs are expected to be (nested) structures of "
            "`tf.data.Dataset` objects. Python `list` is not supported and you should use "
            "`tuple` instead."
        )
    raise TypeError(
        "Invalid input to `zip`. Inputs are expected to be (nested) structures of "
        f"`tf.data.Dataset` objects, got {type(datasets).__name__}."
    )


def _dataset_list(datasets: Any) -> List[Dataset]:
    """``datasets`` of sample/choose_from_datasets: a non-empty list of datasets."""
    if isinstance(datasets, Dataset) or not isinstance(datasets, (list, tuple)):
        raise TypeError(
            "Invalid `datasets`. `datasets` should be a list of `tf.data.Dataset`s, got "
            f"{type(datasets).__name__}."
        )
    if not datasets:
        raise ValueError("Invalid `datasets`. `datasets` should not be empty.")
    for d in datasets:
        if not isinstance(d, Dataset):
            raise TypeError(
                "Invalid `datasets`. `datasets` should be a list of `tf.data.Dataset`s, got "
                f"an element of type {type(d).__name__}."
            )
    return list(datasets)


def _incompatible_as_type_error(build: Callable[[], _native.Dataset]) -> Dataset:
    """Builds a nested dataset; element specs that do not fit together raise ``TypeError``
    (as tf.data raises it), other refusals as they are."""
    try:
        return Dataset(build())
    except InvalidArgumentError as e:
        text = str(e)
        if "Incompatible dataset elements" in text or "compatible structures" in text:
            raise TypeError(text) from e
        raise


class _Untraceable(Exception):
    """An interleave function used its element other than as a source's argument."""


class _Element:
    """The placeholder an interleave's function is traced with: sources built from it
    (``TFRecordDataset(e)``, ``TextLineDataset(e)``, ``Dataset.from_tensor_slices(e)``) become
    the template's element source; anything else done with it raises, and the function then
    runs in Python per element."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise _Untraceable()

    __getattr__ = _refuse
    __bool__ = __len__ = __iter__ = __index__ = __int__ = __float__ = _refuse
    __str__ = __format__ = __bytes__ = __fspath__ = __array__ = __reduce__ = _refuse
    __reduce_ex__ = __getitem__ = __contains__ = __call__ = _refuse
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = _refuse  # type: ignore
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _refuse
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = _refuse
    __pow__ = __rpow__ = __neg__ = __pos__ = __abs__ = __invert__ = _refuse
    __and__ = __rand__ = __or__ = __ror__ = __xor__ = __rxor__ = _refuse
    __matmul__ = __rmatmul__ = __lshift__ = __rlshift__ = __rshift__ = __rrshift__ = _refuse

    def __repr__(self) -> str:
        return "<interleave element placeholder>"


def _trace(map_func: Callable[..., Any]) -> Optional[Dataset]:
    """The template ``map_func`` makes of a placeholder element, or ``None`` when it makes
    none (it uses the element otherwise, fails, or returns something else than a local
    dataset)."""
    try:
        result = map_func(_Element())
    except Exception:  # noqa: BLE001 - any failure means: run it as a Python function
        return None
    if not isinstance(result, Dataset) or result._native.is_service():
        return None
    return result


def _image_key(key: Any) -> Optional[str]:
    if key is not None and not isinstance(key, str):
        raise InvalidArgumentError(f"key must be a dict key (a str) or None, got {key!r}")
    return key


def TFRecordDataset(
    filenames: Union[str, Sequence[str], Dataset], compression_type: Optional[str] = None
) -> Dataset:
    """Every record of the TFRecord files, as ``bytes``.

    ``filenames`` is a glob pattern, a list of file names, or a :meth:`Dataset.list_files`
    dataset (its files are read in sorted order). ``compression_type`` is ``None`` (or ``""``),
    ``"GZIP"`` or ``"ZLIB"``: each file compressed as a whole, as TensorFlow writes them; the
    records are still checksummed.
    """
    if compression_type not in (None, "", "GZIP", "ZLIB"):
        raise InvalidArgumentError(
            f"`compression_type` must be None, '', 'GZIP' or 'ZLIB', got {compression_type!r}"
        )
    return _files(filenames, "tfrecord", compression_type or None)


def TextLineDataset(filenames: Union[str, Sequence[str], Dataset]) -> Dataset:
    """Every line of the text files, without its line ending, as ``bytes``.

    ``filenames`` is as for :func:`TFRecordDataset`.
    """
    return _files(filenames, "lines")


def _files(
    filenames: Union[str, Sequence[str], Dataset], fmt: str, compression: Optional[str] = None
) -> Dataset:
    if isinstance(filenames, _Element):
        return Dataset(_native.Dataset.element_files(fmt, compression))
    if isinstance(filenames, Dataset):
        if filenames._files is None:
            raise InvalidArgumentError(
                "`filenames` must be a pattern, a list of file names or a list_files dataset"
            )
        files: Optional[List[str]] = list(filenames._files)
    elif _is_file_name(filenames):
        pattern = _file_name(filenames)
        return Dataset(_native.Dataset.files(pattern, fmt, None, compression))
    else:
        files = [_file_name(f) for f in filenames]
    return Dataset(_native.Dataset.files(",".join(files), fmt, files, compression))


_OBJECT_URL_SCHEMES = ("s3://", "gs://", "az://", "https://", "http://")


def _matching_files(pattern: str) -> List[str]:
    """The files a glob pattern matches: local paths, or the objects an object-store URL
    (``s3://bucket/train-*.tfrecord``) matches, listed with this process's credentials."""
    if pattern.lower().startswith(_OBJECT_URL_SCHEMES):
        return list(_native.list_objects(pattern))
    return _glob.glob(pattern)


def _is_file_name(value: Any) -> bool:
    """One file name (or pattern), as tf.data takes them: a str, bytes (what an element of
    ``list_files`` is when a function receives it), a path, or a numpy scalar of those."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    return isinstance(value, (str, bytes, np.str_, np.bytes_, _os.PathLike))


def _file_name(value: Any) -> str:
    """A file name as a str: bytes decoded as the file system encodes names."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, (bytes, np.bytes_)):
        return _os.fsdecode(bytes(value))
    if isinstance(value, _os.PathLike):
        return _os.fspath(value)
    return str(value)


def _parallel_calls(value: Optional[int]) -> int:
    """``num_parallel_calls`` as the definition carries it: 0 lets the runner decide."""
    if value is None or value == AUTOTUNE:
        return 0
    return _positive(value, "num_parallel_calls")


def _signature_of(types: Any, shapes: Any) -> Any:
    """``output_types`` and ``output_shapes`` (alike structures) as TensorSpecs."""
    if isinstance(types, tuple):
        if not isinstance(shapes, tuple) or len(shapes) != len(types):
            raise TypeError("`output_shapes` must have the structure of `output_types`")
        return tuple(_signature_of(t, s) for t, s in zip(types, shapes))
    if isinstance(types, dict):
        if not isinstance(shapes, dict) or set(shapes) != set(types):
            raise TypeError("`output_shapes` must have the structure of `output_types`")
        return {k: _signature_of(t, shapes[k]) for k, t in types.items()}
    dtype = getattr(types, "as_numpy_dtype", types)  # a tf.DType
    if dtype in (str, bytes) or getattr(types, "name", None) == "string":
        dtype = "string"
    return TensorSpec(tuple(shapes), dtype)


def _check_signature(signature: Any) -> None:
    """``output_signature`` is TensorSpecs in tuples and dicts with string keys."""
    if isinstance(signature, tuple):
        for s in signature:
            _check_signature(s)
    elif isinstance(signature, dict):
        for k, s in signature.items():
            if not isinstance(k, str):
                raise InvalidArgumentError(f"output_signature dict keys must be str, got {k!r}")
            _check_signature(s)
    elif not isinstance(signature, TensorSpec):
        raise InvalidArgumentError(
            "output_signature must be sluice.data.TensorSpec values in tuples and dicts, got "
            f"{type(signature).__name__}"
        )


def _spec_leaves(spec: Any) -> List[Any]:
    """The TensorSpecs of an element spec, flattened as tf.data does (dicts by sorted key)."""
    if isinstance(spec, tuple):
        return [leaf for s in spec for leaf in _spec_leaves(s)]
    if isinstance(spec, dict):
        return [leaf for k in sorted(spec) for leaf in _spec_leaves(spec[k])]
    return [spec]


def _flatten_up_to(spec: Any, value: Any, what: str) -> List[Any]:
    """``value``'s parts at the positions of ``spec``'s leaves (tf's ``flatten_up_to``):
    below a leaf, ``value`` is one shape or padding value, whatever it holds."""
    if isinstance(spec, tuple):
        if not isinstance(value, (tuple, list)) or len(value) != len(spec):
            raise InvalidArgumentValueError(
                f"`{what}` must have the element's structure: expected a tuple of "
                f"{len(spec)}, got {value!r}"
            )
        return [leaf for s, v in zip(spec, value) for leaf in _flatten_up_to(s, v, what)]
    if isinstance(spec, dict):
        if not isinstance(value, Mapping) or sorted(value) != sorted(spec):
            raise InvalidArgumentValueError(
                f"`{what}` must have the element's structure: expected a dict with keys "
                f"{sorted(spec)}, got {value!r}"
            )
        return [leaf for k in sorted(spec) for leaf in _flatten_up_to(spec[k], value[k], what)]
    return [value]


def _padded_shape(shape: Any, component: int) -> List[int]:
    """A padded shape as the definition holds it: sizes, -1 for the batch's largest."""
    if hasattr(shape, "as_list"):
        shape = shape.as_list()
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = [shape]
    if isinstance(shape, np.ndarray):
        shape = shape.tolist()
    if not isinstance(shape, (list, tuple)):
        raise InvalidArgumentValueError(
            f"padded shape of component {component} must be a list of sizes (None or -1 for "
            f"the batch's largest), got {shape!r}"
        )
    dims = []
    for d in shape:
        if d is None:
            dims.append(-1)
        elif isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= -1:
            dims.append(int(d))
        else:
            raise InvalidArgumentValueError(
                f"padded shape of component {component} has dimension {d!r}; a dimension is "
                "a size, or None or -1 for the batch's largest"
            )
    return dims


def _padding_value(value: Any, spec: Any) -> Any:
    """A padding value as ``[dtype, shape, data]`` of the component's dtype: a Python scalar
    takes it, a numpy value must have it (tf.data's TypeError otherwise)."""
    dtype = "string" if spec.dtype == "string" else np.dtype(spec.dtype).name
    if isinstance(value, (str, bytes)):
        array: Any = np.array(value, dtype=object)
        have = "string"
    elif isinstance(value, (bool, int, float)) and dtype != "string":
        target = np.dtype(dtype)
        ok = isinstance(value, bool) == (target.kind == "b") and not (
            isinstance(value, float) and target.kind in "iu"
        )
        have = dtype if ok else type(value).__name__
        array = np.array(value, dtype=target) if ok else None
    else:
        array = np.asarray(value)
        have = "string" if array.dtype.kind in "SUO" else array.dtype.name
    if have != dtype:
        raise TypeError(
            f"Invalid `padding_values`. `padding_values` values type {have} does not match "
            f"type {dtype} of the corresponding input component."
        )
    if array.shape != ():
        raise InvalidArgumentValueError(
            "Invalid `padding_values`. `padding_values` values should be scalars, but got "
            f"{list(array.shape)}."
        )
    return tuple(_tensor_parts(array))


def _positive(value: int, name: str) -> int:
    if value <= 0:
        raise InvalidArgumentError(f"`{name}` must be positive, got {value}")
    return int(value)


def _columns(value: Any) -> Any:
    """``value`` with each array replaced by ``[dtype, shape, data]``, tuples and dicts kept."""
    if isinstance(value, tuple):
        return tuple(_columns(v) for v in value)
    if isinstance(value, dict):
        return {k: _columns(v) for k, v in value.items()}
    if isinstance(value, Dataset):
        raise InvalidArgumentError(
            "a Dataset cannot be an element: Sluice's elements are tensors (numpy arrays), and "
            "tf.data's datasets of datasets have no counterpart; build the dataset from its "
            "elements' source instead"
        )
    return list(_tensor_parts(value))
