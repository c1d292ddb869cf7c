"""Growth: progressive scaling of TokenFormers by parameter tokens (paper §3.3, Eq. 12-13), Net2Net
widening of timm ViTs as the baseline, and growing the training state with the model.

- `tokens`: kinds and sizes of a model, [`grow`][tkvision.growth.tokens.grow] (in memory), loading a smaller model's
weights;
- `net2net`: [`net2net_widen`][tkvision.growth.net2net.net2net_widen];
- `training`: optimizer moments, EMA and frozen rows across a growth step.

Growing a weights *file* is `tkvision.engine.checkpoint.grow_weights_file` (``tools/grow.py``).
"""
from .net2net import mlps, net2net_widen
from .tokens import (
                     check_reachable,
                     checkpoint_size,
                     grow,
                     grow_to,
                     grow_to_checkpoint,
                     load_grown_state_dict,
                     model_size,
                     pattention_layers,
                     schedule_sizes,
                     target_counts,
                     target_size,
                     token_counts,
)
from .training import freeze_old_tokens, grow_optimizer_state, grow_training_state, scale_new_token_updates

__all__ = ['check_reachable', 'pattention_layers', 'token_counts', 'target_counts', 'grow', 'model_size', 'target_size',
           'schedule_sizes', 'grow_to', 'checkpoint_size', 'grow_to_checkpoint', 'load_grown_state_dict',
           'mlps', 'net2net_widen', 'grow_optimizer_state', 'grow_training_state', 'freeze_old_tokens',
           'scale_new_token_updates']
