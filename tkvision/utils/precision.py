"""The ``amp`` config values and the autocast dtypes they name: the one table of them (the device plan,
``tkvision.engine.distributed.device_plan``, and the model benchmark read it)."""
from typing import Dict, Optional

import torch

__all__ = ['AMP_DTYPES']

#: ``amp`` config value -> autocast dtype (None: full precision, float32).
AMP_DTYPES: Dict[Optional[str], Optional[torch.dtype]] = {None: None, 'bf16': torch.bfloat16, 'fp16': torch.float16}
