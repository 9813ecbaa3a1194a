"""``forwarded``: an attribute of an object that lives on an object it holds (an
optimizer wrapper's ``param_groups``, a plugin's ``loss_scale``), declared in one line."""


def forwarded(holder, name, doc=None, settable=False):
    """A property reading ``self.<holder>.<name>`` (and, with ``settable``, writing it:
    an LR scheduler assigns a wrapper's ``param_groups``)."""
    def get(self):
        return getattr(getattr(self, holder), name)

    def put(self, value):
        setattr(getattr(self, holder), name, value)

    return property(get, put if settable else None, doc=doc)
