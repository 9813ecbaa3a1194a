"""DistributedDataParallel's state dicts carry no wrapper prefix: ``state_dict()`` has
the keys of ``module.state_dict()`` (torch's DDP adds ``module.``), so a checkpoint
loads into the bare model, and ``load_state_dict`` takes keys with or without it."""


def install(wrapper):
    """Registers the three hooks below on ``wrapper``."""
    wrapper._register_state_dict_hook(_strip_prefix)
    wrapper._register_load_state_dict_pre_hook(_add_prefix, with_module=True)
    wrapper.register_load_state_dict_post_hook(_unprefixed_report)


def _dotted(meta_key):
    """A state-dict metadata key ("a.b", "" for the root) as a key prefix ("a.b.", "")."""
    return meta_key + "." if meta_key else ""


def _undotted(key_prefix):
    return key_prefix[:-1] if key_prefix else ""


def _strip_prefix(module, state_dict, prefix, local_metadata):
    """state_dict hook: ``<prefix>module.x`` -> ``<prefix>x`` (no wrapper prefix)."""
    inner = prefix + "module."
    for key in [k for k in state_dict if k.startswith(inner)]:
        state_dict[prefix + key[len(inner):]] = state_dict.pop(key)
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:
        for key in [k for k in metadata if _dotted(k).startswith(inner)]:
            metadata[_undotted(prefix + _dotted(key)[len(inner):])] = metadata.pop(key)
    return state_dict


def _add_prefix(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                error_msgs):
    """load_state_dict pre-hook: a bare model's keys (ours) get the ``module.`` prefix,
    a wrapped model's (torch's DDP) keep theirs. Which one a state dict is, is decided
    by which reading names more of the wrapped module's keys, not by the prefix alone:
    the wrapped model may have a child called ``module`` of its own."""
    inner = prefix + "module."
    keys = [k for k in state_dict if k.startswith(prefix)]
    expected = set(module.module.state_dict().keys())
    bare_hits = sum(k[len(prefix):] in expected for k in keys)
    wrapped_hits = sum(k.startswith(inner) and k[len(inner):] in expected for k in keys)
    if wrapped_hits > bare_hits:
        return
    for key in keys:
        state_dict[inner + key[len(prefix):]] = state_dict.pop(key)
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:  # read all before writing: "module" may be a child's name
        metadata.update({_undotted(inner + _dotted(key)[len(prefix):]): metadata[key]
                         for key in metadata if _dotted(key).startswith(prefix)})


def _unprefixed_report(module, incompatible_keys):
    """load_state_dict post-hook: missing and unexpected keys are reported as the user's
    state dict spells them, without the wrapper's ``module.``."""
    for keys in (incompatible_keys.missing_keys, incompatible_keys.unexpected_keys):
        keys[:] = [k[len("module."):] if k.startswith("module.") else k for k in keys]
