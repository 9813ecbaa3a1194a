"""Stand-ins for Apex's compiled extension modules that public code imports by their
top-level names: ``amp_C`` (the multi-tensor kernels ``multi_tensor_applier`` calls),
``apex_C``, ``fused_layer_norm_cuda``, ``fused_adam_cuda`` and ``syncbn``: Apex's
function names and argument order, on core_ops' ops, on any device. The alias finder
(core_ops.compat.apex) serves them under those names (``import amp_C``); importing
them from here installs no alias."""
