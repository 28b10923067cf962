"""Programs: the modules of a model (`main` plus sub-modules), and its compile/run entry points.

`Program` is what `parse_onnx` returns and what users compile and run, with MIGraphX's Python
API: `compile(target)`, `run({name: array})` -> list of arguments, `get_parameter_shapes()`,
`get_inputs()`, `get_outputs()`, `get_output_shapes()`. Compiling asks the target (an object, or
a name looked up in `ir.registry`) to run its pass list and make an executable; running checks
the inputs against the parameters first, so a wrong name, type or shape fails with a message
that says which. The parameters are read from `main` once per executable (the executable binds
those it was made for), and inputs that are numpy arrays of the exact type and lens pass in one
short loop: on MobileNetV2 at batch 1 the walk over the module had cost more than all the rest
of a run outside its steps.

Threads: `run` on one compiled program is safe from any number of threads. Executables that
keep per-run state run one call at a time under the program's lock; those that declare
`reentrant = True` are called without it: their state is per call (ref), or they serialise
their runs themselves (the cpu target's pre-bound slots, under its executable's own lock: one
lock a run, not two). `compile` holds the same lock, so a second concurrent compile waits and then
fails clearly ("already compiled"). Outputs never alias the caller's inputs or the program's
own buffers: an output that may share memory with an input, is read-only (a literal) or is
returned twice is copied.
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from pygraphx.ir import registry
from pygraphx.ir.argument import Argument
from pygraphx.ir.module import Module
from pygraphx.ir.shape import Shape, from_dtype
from pygraphx.ir.trace import with_eval_trace

if TYPE_CHECKING:
    from pygraphx.ir.registry import CompileTarget, Executable

#: most specialized programs (per input lens / values) a dynamic program keeps, least recently
#: used dropped first
SPECIALIZED_CACHE_SIZE = 16


class ProgramError(RuntimeError):
    """Misuse of a program: running before compiling, wrong inputs, ..."""


class Program:
    """A model in the IR: modules by name, `main` first."""

    def __init__(self) -> None:
        self.modules: dict[str, Module] = {}
        self.output_names: list[str] = []
        self.target: CompileTarget | None = None
        self.compile_options: dict[str, Any] = {}
        self._executable: Executable | None = None
        self.pass_times: list[tuple[str, float]] = []
        # dynamic input dimensions: rebuild the program for concrete lens (set by the frontend),
        # re-apply the program-level transforms (quantize, optimize) and compile, cached per lens
        self.specializer: Callable[[dict[str, np.ndarray]], Program] | None = None
        # plain data the frontend rebuilds `specializer` from after a load (ir/serialize.py)
        self.specializer_spec: dict[str, Any] | None = None
        # inputs whose values decide shapes: the program is compiled per value at run time
        self.value_inputs: set[str] = set()
        # graph outputs that are sequences: how many of the returned tensors each one takes
        # (None: a tensor); `run` gives a sequence back as a list
        self.output_structure: list[int | None] | None = None
        self.transforms: list[Callable[[Program], Any]] = []
        self._specialized: OrderedDict[tuple, Program] = OrderedDict()
        self._evicted = False  # the one-time warning that values keep changing was given
        self._dynamic = False  # set at compile: some parameter has dynamic dimensions
        # what `run` checks inputs against, taken from `main` for the executable it names
        self._signature: _Signature | None = None
        # compile, specialisation and non-reentrant runs take it (see the module docstring)
        self._lock = threading.RLock()
        self.create_module("main")

    # --- modules --------------------------------------------------------------------------
    def get_main_module(self) -> Module:
        return self.modules["main"]

    def create_module(self, name: str, parent: Module | None = None) -> Module:
        if name in self.modules:
            raise ProgramError(f"program already has a module named {name!r}")
        mod = Module(name)
        mod.parent = parent
        self.modules[name] = mod
        return mod

    def get_module(self, name: str) -> Module:
        try:
            return self.modules[name]
        except KeyError:
            raise ProgramError(f"program has no module {name!r}") from None

    def remove_module(self, name: str) -> None:
        del self.modules[name]

    # --- signature ------------------------------------------------------------------------
    def get_parameter_names(self) -> list[str]:
        return self.get_main_module().get_parameter_names()

    def get_parameter_shapes(self) -> dict[str, Shape]:
        return self.get_main_module().get_parameter_shapes()

    def get_inputs(self) -> dict[str, Shape]:
        """Parameter name -> shape (MIGraphX's `get_inputs()`); for dynamic parameters the
        maximum shape (`get_parameter_shapes()` gives their ranges)."""
        return {i.op.parameter: i.shape for i in self.get_main_module().get_parameters()}

    def get_output_shapes(self) -> list[Shape]:
        return self.get_main_module().get_output_shapes()

    def get_output_names(self) -> list[str]:
        shapes = self.get_output_shapes()
        names = list(self.output_names[: len(shapes)])
        names += [f"main:#output_{k}" for k in range(len(names), len(shapes))]
        return names

    def get_outputs(self) -> dict[str, Shape]:
        """Output name -> shape, in output order."""
        return dict(zip(self.get_output_names(), self.get_output_shapes(), strict=True))

    # --- compile and run ------------------------------------------------------------------
    def is_dynamic(self) -> bool:
        """Whether some parameter has dynamic dimensions."""
        return any(s.dynamic() for s in self.get_parameter_shapes().values())

    def get_memory_usage(self) -> int:
        """Bytes of the scratch arena that memory_coloring planned for `main` (planned now if
        no pass has done it)."""
        main = self.get_main_module()
        if main.memory_plan is None:
            return registry.plan_memory(main).arena_bytes
        return main.memory_plan.arena_bytes

    def is_compiled(self) -> bool:
        return self._executable is not None

    def compile(
        self,
        t: CompileTarget | str,
        offload_copy: bool = True,
        fast_math: bool = True,
        device_id: int = 0,
        exhaustive_tune: bool = False,
    ) -> None:
        """Optimise the program for target `t` and prepare it to run (in place).

        The target runs its pass list (constant folding, simplification, fusion, memory
        planning) and lowers the program to its executable. Passes that `pygraphx.optimize`
        already ran on the unchanged program are not run again.

        Args:
            t: a target (`pygraphx.get_target("cpu")`) or its name (`"ref"`, `"cpu"`, `"gpu"`).
            offload_copy: gpu: `run` takes host arrays and returns host arrays (copies to and
                from the device); False takes and returns device arguments.
            fast_math: allow faster approximations where a target has them.
            device_id: gpu: which device (unless the target was made with its own).
            exhaustive_tune: search kernel settings longer at compile time.

        Compiling is atomic: a concurrent second compile waits for the first, then fails as
        already compiled.

        Raises:
            ProgramError: the program is already compiled.

        Example:
            >>> prog = pygraphx.parse_onnx("model.onnx")
            >>> prog.compile(pygraphx.get_target("cpu"))
        """
        with self._lock:
            self._compile(t, offload_copy, fast_math, device_id, exhaustive_tune)

    def _compile(
        self,
        t: CompileTarget | str,
        offload_copy: bool,
        fast_math: bool,
        device_id: int,
        exhaustive_tune: bool,
    ) -> None:
        if self.is_compiled():
            raise ProgramError(f"program is already compiled for target {self.target.name!r}")
        if isinstance(t, str):
            t = registry.get_target(t)
        options = {
            "offload_copy": offload_copy,
            "fast_math": fast_math,
            "device_id": device_id,
            "exhaustive_tune": exhaustive_tune,
        }
        self._dynamic = self.is_dynamic()
        self._executable = t.compile(self, options)
        self.target = t
        self.compile_options = options

    def run(self, params: Mapping[str, Any], observer: Any = None) -> list[Argument]:
        """Run the compiled program on `params` and return its outputs, in output order.

        Args:
            params: input name -> numpy array or `argument` (on a gpu program compiled with
                `offload_copy=False`: device arguments, torch CUDA tensors or DLPack objects).
                Types and lens are checked against the parameters; a program with dynamic
                dimensions takes any lens inside its ranges.
            observer: `observer(instruction, value, seconds)` is called after each instruction
                of `main` (profiling and tracing).

        Returns:
            One `argument` per output; `np.array(arg)` gives its values.

        Raises:
            ProgramError: the program is not compiled, or an input is missing, unknown, or of
                the wrong type or lens (the message says which).

        Example:
            >>> out = prog.run({"input": np.zeros((1, 3, 224, 224), np.float32)})
            >>> np.array(out[0]).shape
            (1, 1000)
        """
        if self._executable is None:
            raise ProgramError("compile the program first: prog.compile(pygraphx.get_target(...))")
        device_io = getattr(self._executable, "takes_device_arguments", None)
        if device_io is not None and device_io(params):
            return self._run_device(params, observer)
        given = self._structured_inputs(params) if self.value_inputs else {}
        if given:
            arrays = self._check_params({n: v for n, v in params.items() if n not in given})
        else:  # nothing to take out: no copy of the mapping (a comprehension's frame a run)
            arrays = self._check_params(params)
        # _check_params has fixed the lens of static parameters; only ranges can differ
        if self.value_inputs or (self._dynamic and self._off_max_lens(arrays)):
            with self._lock:
                prog = self._specialized_for({**given, **arrays})
            names = prog._signature_now().names
            return prog.run({n: a for n, a in arrays.items() if n in names}, observer)
        observer = with_eval_trace(self.get_main_module(), observer)  # PGX_TRACE_EVAL, read per run
        executable = self._executable
        if getattr(executable, "reentrant", False):
            outputs = self._run_executable(executable, arrays, observer)
        else:
            with self._lock:
                outputs = self._run_executable(executable, arrays, observer)
        results = _owned_arguments(outputs, arrays)
        structure = self.output_structure
        return results if structure is None else _grouped(results, structure)

    def _structured_inputs(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The value inputs that are no parameter (sequences, optionals): they pass as given.
        Only programs with value inputs pay for this walk over the parameters."""
        param_names = set(self.get_parameter_names())
        given = {n: params[n] for n in self.value_inputs - param_names if n in params}
        absent = sorted(self.value_inputs - set(params) - param_names)
        if absent:
            raise ProgramError(f"missing input(s) {absent} (sequences or optionals)")
        return given

    @staticmethod
    def _run_executable(
        executable: Executable, arrays: dict[str, np.ndarray], observer: Any
    ) -> list[np.ndarray]:
        if observer is None:
            return executable.run(arrays)
        return executable.run(arrays, observer=observer)

    eval = run

    def _run_device(self, params: Mapping[str, Any], observer: Any) -> list[Any]:
        """Device arguments in and out (a gpu target's `offload_copy=False`, or device tensors
        given as inputs); the target's executable checks and binds them. Static programs only."""
        if self.value_inputs or self._dynamic:
            raise ProgramError(
                "device arguments need a program with static shapes; pass host arrays to a "
                "program with dynamic dimensions or shape-deciding inputs"
            )
        try:
            with self._lock:  # device executables keep per-run buffers (captured graphs)
                return self._executable.run_device(params, observer, self.get_output_names())
        except ValueError as exc:
            raise ProgramError(str(exc)) from None

    def _off_max_lens(self, arrays: Mapping[str, np.ndarray]) -> bool:
        """Whether some input's lens differ from the maximum lens the body was built for."""
        return any(arrays[p.name].shape != p.max_lens for p in self._signature_now().params)

    def _specialized_for(self, arrays: Mapping[str, np.ndarray]) -> Program:
        """The program compiled for these concrete input lens (dynamic dimensions) and, for
        inputs that decide shapes (`value_inputs`), these input values; cached."""
        if self.specializer is None:
            raise ProgramError("internal: dynamic parameters without a specializer")
        key = tuple((n, _key(a, n in self.value_inputs)) for n, a in sorted(arrays.items()))
        prog = self._specialized.get(key)
        if prog is not None:
            self._specialized.move_to_end(key)
            return prog
        prog = self.specializer(dict(arrays))
        for transform in self.transforms:
            transform(prog)
        prog.compile(self.target, **self.compile_options)
        self._specialized[key] = prog
        if len(self._specialized) > SPECIALIZED_CACHE_SIZE:
            self._specialized.popitem(last=False)
            if not self._evicted:
                self._evicted = True
                what = f"values of {sorted(self.value_inputs)}" if self.value_inputs else "lens"
                warnings.warn(
                    f"input {what} keep changing: more than {SPECIALIZED_CACHE_SIZE} distinct "
                    "ones were compiled for, the least recently used are dropped and compiled "
                    "again when they come back (each new one costs a full compile)",
                    RuntimeWarning,
                    stacklevel=3,
                )
        return prog

    def _signature_now(self) -> _Signature:
        """The parameters the current executable binds: read from `main` once per executable
        (the walk over the module costs more than the rest of a small model's run outside its
        steps); an executable is made from the module as it is then and binds those parameters
        whatever edits the module sees later, so a new executable is what renews it."""
        sig = self._signature
        if sig is None or sig.executable is not self._executable:
            sig = _Signature.of(self.get_main_module(), self._executable)
            self._signature = sig
        return sig

    def _check_params(self, params: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The inputs as arrays, checked against the parameters. The common case (every
        parameter given once, as a numpy array or an `argument` of its exact type and static
        lens, nothing else) passes in one loop; anything else takes `_check_params_fully`,
        which raises the error that names the problem."""
        sig = self._signature_now()
        arrays: dict[str, np.ndarray] = {}
        for p in sig.params:
            value = params.get(p.name)
            if type(value) is Argument:
                value = value.array
            if type(value) is not np.ndarray or value.dtype != p.dtype or value.shape != p.lens:
                return self._check_params_fully(params, sig.shapes)
            arrays[p.name] = value
        if len(params) != len(arrays):  # some name is no parameter
            return self._check_params_fully(params, sig.shapes)
        return arrays

    def _check_params_fully(
        self, params: Mapping[str, Any], expected: Mapping[str, Shape]
    ) -> dict[str, np.ndarray]:
        unknown = sorted(set(params) - set(expected))
        if unknown:
            raise ProgramError(
                f"unknown parameter(s) {unknown}; the program's parameters are {list(expected)}"
            )
        arrays: dict[str, np.ndarray] = {}
        for name, shape in expected.items():
            if name not in params:
                raise ProgramError(f"missing parameter {name!r} ({shape})")
            value = params[name]
            arr = value.array if isinstance(value, Argument) else np.asarray(value)
            if arr.dtype != shape.dtype():
                got = _type_name(arr.dtype)
                raise ProgramError(
                    f"parameter {name!r} expects {shape.type()} but got {got}; "
                    f"convert it with .astype(np.{shape.dtype().name})"
                )
            if shape.dynamic():
                if not shape.accepts(arr.shape):
                    raise ProgramError(
                        f"parameter {name!r} expects lens within {shape} but got {list(arr.shape)}"
                    )
            elif list(arr.shape) != shape.lens():
                raise ProgramError(
                    f"parameter {name!r} expects lens {shape.lens()} but got {list(arr.shape)}"
                )
            arrays[name] = arr
        return arrays

    # --- printing -------------------------------------------------------------------------
    def __str__(self) -> str:
        from pygraphx.ir.printer import print_program

        return print_program(self)

    def modules_in_print_order(self) -> list[Module]:
        """`main`, then the other modules in the order they were created."""
        main = self.get_main_module()
        return [main] + [m for m in self.modules.values() if m is not main]

    def sort(self) -> None:
        """Kept for MIGraphX API compatibility: modules are always in a valid order."""

    def validate(self) -> None:
        for mod in self.modules.values():
            mod.validate()


def _key(value: Any, by_value: bool) -> Any:
    """What identifies an input for the cache: lens and type, and its bytes when `by_value`
    (lists and None: sequences and empty optionals, always by value)."""
    if value is None:
        return None
    if isinstance(value, list | tuple):
        return tuple(_key(np.asarray(v), True) for v in value)
    return (tuple(value.shape), value.dtype.str, value.tobytes() if by_value else b"")


def _grouped(results: list[Any], structure: list[int | None] | None) -> list[Any]:
    """`results` with the tensors of each sequence output gathered into a list."""
    if structure is None:
        return results
    out: list[Any] = []
    k = 0
    for count in structure:
        if count is None:
            out.append(results[k])
            k += 1
        else:
            out.append(results[k : k + count])
            k += count
    return out


def _owned_arguments(
    outputs: list[np.ndarray], inputs: Mapping[str, np.ndarray]
) -> list[Argument]:
    """`outputs` as arguments the caller owns: a copy of every array that may share memory
    with an input, is read-only (a literal of the program) or appears twice (one loop, run17)."""
    result: list[Argument] = []
    others = list(inputs.values())  # the inputs, then the outputs kept so far
    share = np.may_share_memory
    new = Argument.__new__
    for out in outputs:
        arr = out if type(out) is np.ndarray else np.asarray(out)
        copy = not arr.flags.writeable
        if not copy:
            for other in others:
                if share(arr, other):
                    copy = True
                    break
        if copy:
            arr = arr.copy()
        others.append(arr)
        strides = arr.strides  # (`min`'s `default=` costs more than the test)
        if strides and min(strides) < 0:
            result.append(Argument(arr))
            continue
        arg = new(Argument)
        arg.array = arr
        result.append(arg)
    return result


def _type_name(dtype: np.dtype) -> str:
    try:
        return from_dtype(dtype)
    except ValueError:
        return str(dtype)


class _Param(NamedTuple):
    """One parameter as `run` checks it: `lens` is None for a dynamic one (never equal to an
    input's shape tuple, so it takes the full check); `max_lens` the lens its body has."""

    name: str
    dtype: np.dtype
    lens: tuple[int, ...] | None
    max_lens: tuple[int, ...]


class _Signature(NamedTuple):
    """`main`'s parameters for one executable (see `Program._signature_now`)."""

    executable: Any
    params: tuple[_Param, ...]
    shapes: dict[str, Shape]
    names: frozenset[str]

    @staticmethod
    def of(main: Module, executable: Any) -> _Signature:
        shapes = main.get_parameter_shapes()
        params = tuple(
            _Param(
                i.op.parameter,
                shapes[i.op.parameter].dtype(),
                None if shapes[i.op.parameter].dynamic() else tuple(i.shape.lens()),
                tuple(i.shape.lens()),
            )
            for i in main.get_parameters()
        )
        return _Signature(executable, params, shapes, frozenset(shapes))
