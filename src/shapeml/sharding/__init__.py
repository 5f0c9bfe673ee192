"""Scale out by named dims: a rule table from dim names to mesh axes places every field.

`shard(m, mesh, fsdp("data"))` is FSDP (every field split along its largest axis), `{"F": "model"}`
tensor parallel, `fsdp("data", {"F": "model"})` both, `{}` data parallel;
`partition_specs` plans without devices (`partition_spec` one array whose axes are named by
dims, such as a KV cache); `memory_report` counts bytes per device; `load` reads a checkpoint
straight onto its shards; `step_shardings` lays out a training step, its optimizer state paired
with the params by structure; `batch_part` and `place_local_batch` feed a batch from several
processes. Meshes may have Auto or Explicit axes (`make_mesh(..., axis_types=)`). See
`docs/scaling.md`. `use_cpu_devices` makes the CPU cores JAX devices (called first, explicitly).
"""

from ._cpu_devices import use_cpu_devices as use_cpu_devices
from ._errors import AxisReusedError as AxisReusedError
from ._errors import CpuDevicesStartedError as CpuDevicesStartedError
from ._errors import IndivisibleDimError as IndivisibleDimError
from ._errors import MeshSpecError as MeshSpecError
from ._errors import ProcessLayoutError as ProcessLayoutError
from ._errors import RuleTableError as RuleTableError
from ._errors import UnknownMeshAxisError as UnknownMeshAxisError
from ._errors import UnknownRuleDimError as UnknownRuleDimError
from ._fsdp import Fsdp as Fsdp
from ._fsdp import fsdp as fsdp
from ._load import load as load
from ._memory import FieldMemory as FieldMemory
from ._memory import MemoryReport as MemoryReport
from ._memory import memory_report as memory_report
from ._mesh import make_mesh as make_mesh
from ._mesh import mesh_shape as mesh_shape
from ._mesh import parse_rules as parse_rules
from ._place import StepShardings as StepShardings
from ._place import field_plans as field_plans
from ._place import partition_spec as partition_spec
from ._place import partition_specs as partition_specs
from ._place import place_batch as place_batch
from ._place import shard as shard
from ._place import shardings as shardings
from ._place import shardings_like as shardings_like
from ._place import step_shardings as step_shardings
from ._process import batch_part as batch_part
from ._process import place_local_batch as place_local_batch
from ._rules import FieldPlan as FieldPlan

__all__ = [
    "AxisReusedError",
    "CpuDevicesStartedError",
    "FieldMemory",
    "Fsdp",
    "FieldPlan",
    "IndivisibleDimError",
    "MemoryReport",
    "MeshSpecError",
    "ProcessLayoutError",
    "RuleTableError",
    "StepShardings",
    "UnknownMeshAxisError",
    "UnknownRuleDimError",
    "batch_part",
    "field_plans",
    "fsdp",
    "load",
    "make_mesh",
    "memory_report",
    "mesh_shape",
    "parse_rules",
    "partition_spec",
    "partition_specs",
    "place_batch",
    "place_local_batch",
    "shard",
    "shardings",
    "shardings_like",
    "step_shardings",
    "use_cpu_devices",
]
