"""The machine a measurement ran on, in the fields every benchmark's report carries: CPU and its ISA flags,
cores and torch threads, the GPU if any, versions, and the load average that says whether other processes
shared it."""

from __future__ import annotations

import os
import platform


def machine() -> dict:
    import torch

    from ..models import cpu_flags

    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "isa": sorted(cpu_flags()), "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(),
            "device": "cuda: " + torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "load_average": [round(x, 2) for x in os.getloadavg()]}
