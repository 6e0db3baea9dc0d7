"""The hardware cost model: per-op GPU latencies from measured tables (torch-free).

See :mod:`simulator.hardware.tables`. ``load_gpu("a100-sxm").gemm(1, 4096, 4096)`` is the
measured latency of that GEMM on an A100-SXM4-80GB, tagged exact, interpolated,
extrapolated or assumed.
"""

from simulator.errors import HardwareError
from simulator.hardware.tables import TAGS, Estimate, GpuTables, gpu_specs, load_gpu

__all__ = ["TAGS", "Estimate", "GpuTables", "HardwareError", "gpu_specs", "load_gpu"]
