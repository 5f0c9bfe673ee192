"""The errors of placing models on a device mesh by rules over their dims (codes E1901..E1949)."""

from __future__ import annotations

from .._errors import ShapemlError

__all__ = [
    "AxisReusedError",
    "CpuDevicesStartedError",
    "IndivisibleDimError",
    "MeshSpecError",
    "ProcessLayoutError",
    "RuleTableError",
    "UnknownMeshAxisError",
    "UnknownRuleDimError",
]


class UnknownRuleDimError(
    ShapemlError,
    KeyError,
    code="E1901",
    title="sharding rule places no field",
    explanation="""
A rule table maps dim names to mesh axes (`{"D": "model", "F": "model"}`). One of its rules places
no axis of any field: its key is neither a dim the model (or one of its sub-models) declares nor a
dim expression a field spells (`"H*Dh"`, `"P*P"`); or it is a dim no field's axis is spelled with;
or every axis it names is placed by the rule of an outer spelling (a layer's `In` mapped to the
parent's `D`, with a rule for `D`: the outermost spelling with a rule wins). A rule with no effect
would silently leave what it names replicated, so it is refused; the message lists the spellings
of the fields' axes and suggests a close one.

    sm.shard(m, mesh, {"Dff": "model"})   # E1901: the model declares F, not Dff
    sm.shard(m, mesh, {"F": "model"})
""",
):
    def __str__(self) -> str:  # KeyError would otherwise quote the whole message
        return ShapemlError.__str__(self)


class UnknownMeshAxisError(
    ShapemlError,
    KeyError,
    code="E1902",
    title="sharding rule names an axis the mesh does not have",
    explanation="""
A rule table (or a batch axis) names a mesh axis that the mesh it is applied to does not have.
Mesh axes are named when the mesh is made: `Mesh(devices.reshape(2, 2), ("data", "model"))`, or
`shapeml train --mesh data=2,model=2`. Rename the rule's axis, or make the mesh with that axis.
""",
):
    def __str__(self) -> str:
        return ShapemlError.__str__(self)


class IndivisibleDimError(
    ShapemlError,
    ValueError,
    code="E1903",
    title="dim not divisible by its mesh axes",
    explanation="""
A field's dim is split evenly over the devices of the mesh axes its rule names, so its size must be
a multiple of the product of those axes' sizes. The message names the field, the dim, its size and
the axes. Choose a mesh whose axis sizes divide the dim, change the dim (`init(seed=0, D=64)`), or
leave that dim out of the rules (replicated). A batch split over the data axis must likewise be a
multiple of the data axis's size.

A dim expression whose first factor is a ruled dim (`H*Dh` under `{"H": "tp"}`) is split by that
factor, so the factor itself (whole heads per device) must divide.
""",
):
    pass


class AxisReusedError(
    ShapemlError,
    ValueError,
    code="E1904",
    title="two dims of one field on the same mesh axis",
    explanation="""
A `PartitionSpec` may use each mesh axis once: one field cannot be split over the same axis along
two of its dims. The rules map two dims of the named field to one axis, or the field reads one dim
twice (a square `[D D]` weight under `{"D": "model"}`).

Map one of the dims to another axis, or declare the field so that its axes have distinct names
(`wq: Float[Array, "D H*Dh"]` instead of `"D D"`, with `Dh="D // H"`), then rule the one you
want split.
""",
):
    pass


class RuleTableError(
    ShapemlError,
    TypeError,
    code="E1905",
    title="invalid sharding rule table",
    explanation="""
A rule table is a mapping from dim names (or dim expressions spelled in a field, `"H*Dh"`) to a
mesh axis name, a tuple of axis names (split over their product) or None (replicated):

    {"D": "data", "F": ("data", "model"), "V": None}

On the command line: `--shard D=data --shard F=data+model`. A key or value of another type, an
empty tuple or an axis listed twice in one value is refused.
""",
):
    pass


class MeshSpecError(
    ShapemlError,
    ValueError,
    code="E1906",
    title="invalid mesh shape",
    explanation="""
A mesh is given as named axis sizes, `data=2,model=2` (or `{"data": 2, "model": 2}`): each name a
Python identifier used once, each size a positive whole number, and their product at most the
number of devices JAX sees. On CPU, make that many devices before any JAX computation:

    import shapeml as sm
    sm.use_cpu_devices(4)   # first thing in the script

An axis's type is "auto" (the default) or "explicit" (JAX's sharding in types), given once for
every axis or once per axis: `make_mesh("data=2,model=2", axis_types=("explicit", "auto"))`.
""",
):
    pass


class ProcessLayoutError(
    ShapemlError,
    ValueError,
    code="E1907",
    title="the processes do not split the batch axis evenly",
    explanation="""
In a job of several processes each process feeds only its part of every batch: the rows its own
devices hold along the mesh's data axis. That needs the devices of each process to hold one
contiguous run of the axis's blocks, every run of the same length (or every process the whole
axis). A mesh whose devices were listed in another order (a hand-made `Mesh` over a shuffled
device list), or one that leaves a process out, breaks that; the message names the process and
the blocks its devices hold.

`sharding.make_mesh("data=4,model=2")` lays `jax.devices()` out process by process with the
first axis outermost, so naming the data axis first gives every process its own run.
""",
):
    pass


class CpuDevicesStartedError(
    ShapemlError,
    RuntimeError,
    code="E1908",
    title="CPU devices asked for after JAX started",
    explanation="""
`sm.use_cpu_devices(n)` makes the CPU n JAX devices (`jax.config.update("jax_num_cpu_devices",
n)`), which JAX reads once, when its backend starts: at the first JAX computation, array or
`jax.devices()` call. It was called after that, when the process already had another number of
CPU devices, so nothing changed. The message names both counts.

Call it first, right after the imports and before any JAX computation:

    import shapeml as sm
    sm.use_cpu_devices()        # one device per usable core (at most 8)
    m = Model.init(seed=0)      # JAX starts here, with those devices

Asking again for the count the process already has is not an error.
""",
):
    pass
