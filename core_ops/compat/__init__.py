"""Apex, for code written against it: the ``apex`` import alias (``compat.apex``) and
the stand-ins for Apex's compiled extensions (``compat.apex_extensions``)."""
