# Sourced by tools/wheel_check.sh and tools/compat.sh: `without_compilers DIR` prints a
# PATH under which no C/C++ compiler, nvcc nor linker driver can be found, as on a slim
# container: DIR gets links to every program of $PATH but those.
without_compilers() {
  local bin=$1/bin dir f name IFS=:
  mkdir -p "$bin"
  for dir in $PATH; do
    [ -d "$dir" ] || continue
    for f in "$dir"/*; do
      name=${f##*/}
      case $name in
        cc|c++|cpp|gcc|g++|gcc-*|g++-*|cpp-*|clang|clang++|clang-*|clang++-*|nvcc|icx|icpx|*-linux-gnu-gcc*|*-linux-gnu-g++*|*-linux-gnu-cpp*) continue ;;
      esac
      [ -e "$bin/$name" ] || ln -s "$f" "$bin/$name" 2>/dev/null || true
    done
  done
  echo "$bin"
}
