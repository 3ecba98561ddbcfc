"""Which GPUs this node sees: the one question the node asks the machine.

A module of its own so that `rsgw probe` (and `import rsgw`) can count GPUs as the
supervisor does without loading the supervisor's process machinery.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping

from rsgw.node._node import Visible
from rsgw.node._servers import listed_gpu_uuids
from rsgw.node._supervision import cuda_devices, listed_gpu_count

#: How long `nvidia-smi -L` may take before we treat the node as having no GPU.
NVIDIA_SMI_TIMEOUT = 5.0


def visible_gpu_count(env: Mapping[str, str] = os.environ) -> int | None:
    """How many GPUs this node sees, for `gpus: auto`; None when we cannot tell.

    CUDA_VISIBLE_DEVICES wins when set (an empty value hides every GPU); otherwise we
    count the `GPU n:` lines of `nvidia-smi -L`. No driver, no tool, or a tool that
    fails or hangs all mean "none", and the node then simulates its GPUs.
    """
    seen = visible_gpus(env)
    return len(seen) if isinstance(seen, tuple) else seen


def visible_gpus(env: Mapping[str, str] = os.environ) -> Visible:
    """The GPUs this node sees, for `gpus: auto`: as `visible_gpu_count` counts them, but
    the UUIDs when `nvidia-smi -L` lists them, so each worker's CUDA_VISIBLE_DEVICES
    names its GPU whatever order CUDA enumerates them in."""
    devices = cuda_devices(env)
    if devices is not None:
        return len(devices)
    listing = _nvidia_smi()
    if listing is None:
        return None
    return listed_gpu_uuids(listing) or listed_gpu_count(listing)


def _nvidia_smi() -> str | None:
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return None
    try:
        return subprocess.run(
            [tool, "-L"], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
