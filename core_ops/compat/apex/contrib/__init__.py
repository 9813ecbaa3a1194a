"""The parts of Apex's ``apex.contrib`` that public training code imports:
``clip_grad.clip_grad_norm_``, ``layer_norm.FastLayerNorm`` (and ``FastLayerNormFN``),
and ``optimizers.FP16_Optimizer`` / ``FusedAdam`` / ``FusedSGD`` / ``FusedLAMB``. The
rest of contrib (its CUDA-only attention, convolution and distributed-optimizer
extensions) is not provided; importing it says so."""
