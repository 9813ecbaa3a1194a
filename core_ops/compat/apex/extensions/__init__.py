"""Stand-ins for Apex's compiled extension modules that public code calls directly
(``fused_layer_norm_cuda``, ``fused_adam_cuda``, ``syncbn``): Apex's function names and
argument order, on core_ops' ops, on any device. The alias finder serves them under
their top-level names (``import fused_layer_norm_cuda``)."""
