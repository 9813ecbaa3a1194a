"""On ``sys.path`` only in processes started under ``python -m core_ops.compat.apex``
and their children (Note [Children of the runner]): serves this module from core_ops,
as the alias finder does in the parent."""

from core_ops.compat.apex import serve_from_path

serve_from_path(__name__)
