"""``python -m core_ops build [--cuda] [--arch "8.0;9.0"]``, ``python -m core_ops info`` and
``python -m core_ops settings [--markdown]``."""

import argparse
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m core_ops")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="prebuild the native kernels into the cache")
    b.add_argument("--cuda", action="store_true", help="also build the CUDA kernels")
    b.add_argument("--arch", default=None, help='CUDA arch list, e.g. "8.0;9.0"')
    b.add_argument("--force", action="store_true", help="rebuild even if cached")
    sub.add_parser("info", help="versions, cache path, which backend each op uses, and the settings")
    st = sub.add_parser("settings", help="every setting: its variable, argument, default and meaning")
    st.add_argument("--markdown", action="store_true", help="the table of docs/settings.md")
    args = parser.parse_args(argv)

    from . import _info, native, settings

    if args.command == "settings":
        if args.markdown:
            print(settings.markdown_table(), end="")
        else:
            print(_info.format_settings())
        return 0

    try:
        native.forced_reference()
    except ValueError as e:  # a mistyped CORE_OPS_BACKEND: said once, without a traceback
        print(f"core_ops: {e}", file=sys.stderr)
        return 2
    if args.command == "info":
        print(_info.format_report(_info.backend_report()))
        return 0
    kinds = ["cpu", "cuda"] if args.cuda else ["cpu"]
    ok = True
    for kind in kinds:
        # A failure recorded by an earlier build is retried: asking to build means it.
        arch = args.arch if kind == "cuda" else None
        backend = native.ensure(kind, native.Request(rebuild=args.force, arch=arch, retry_failed=True), warn=False)
        print(f"{kind}: {'ok' if backend.native else 'FAILED'}: {backend.reason}")
        ok &= backend.native
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
