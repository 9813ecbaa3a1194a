# The CPU ops that `python -m core_ops info` does not list as native, one line each:
# the op lines of its [cpu] section (not its "passed over:" lines), up to the next
# section. Empty output: every op native.
#   awk -f tools/cpu_ops_not_native.awk info.log
/^\[cpu\]/ { on = 1; next }
/^\[/ { on = 0 }
on && NF >= 2 && $1 != "passed" && $2 != "native"
