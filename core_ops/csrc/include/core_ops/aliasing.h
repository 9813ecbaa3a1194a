// Note [Aliasing]: which tensors of one call may share memory, checked by every
// multi-tensor and optimizer op before it touches memory (core_ops/_aliasing.py words
// the same check for the reference and fake kernels).
//
// The kernels read and write in chunks, in parallel, across every tensor of every list
// at once, so a tensor the op writes must not share memory with any other tensor of the
// call: not with another output (the last writer would depend on thread timing), not
// with an input read by another chunk (that chunk may see the old or the new values).
// The one exception is in place: out[i] may be in[i] itself (the same memory walked in
// the same order), where an op pairs its lists so (multi_tensor_scale_'s src and dst,
// axpby's x / y and out). Tensors that are only read may share memory freely.
//
// As ATen's assert_no_overlap, only dense tensors are compared (Note [Non-contiguous
// tensors] in tensor_lists.h): the kernels read a tensor that is not dense through a
// contiguous copy made before they start and write one through a temporary copied back
// after they finish, so it cannot race. A written tensor whose elements share memory
// (an expanded one: a stride of 0) is refused outright.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <core_ops/tensor.h>

namespace core_ops {

class Operands {
 public:
  explicit Operands(size_t expected = 0) { reads_.reserve(expected); writes_.reserve(expected); }

  // A list the op reads; `in_place_with`: the written list whose i-th tensor may be
  // this list's i-th tensor itself.
  Operands& reads(TensorList ts, const char* name, const char* in_place_with = nullptr) {
    for (size_t i = 0; i < ts.size(); ++i) add(reads_, ts[i], name, i, in_place_with, false);
    return *this;
  }
  Operands& reads(const Tensor& t, const char* name) {
    add(reads_, t, name, kScalar, nullptr, false);
    return *this;
  }
  Operands& reads(const OptionalTensor& t, const char* name) {
    if (t.has_value()) add(reads_, *t, name, kScalar, nullptr, false);
    return *this;
  }
  Operands& writes(TensorList ts, const char* name) {
    for (size_t i = 0; i < ts.size(); ++i) add(writes_, ts[i], name, i, nullptr, true);
    return *this;
  }
  Operands& writes(const Tensor& t, const char* name) {
    add(writes_, t, name, kScalar, nullptr, true);
    return *this;
  }
  Operands& writes(const OptionalTensor& t, const char* name) {
    if (t.has_value()) add(writes_, *t, name, kScalar, nullptr, true);
    return *this;
  }

  // Raises ValueError naming the first two tensors that may not share memory.
  void check() {
    // Of two outputs at one address, the one named first in the call comes first (as the
    // Python check's stable sort): spans are added in the call's order, so `order` ties.
    for (size_t k = 0; k < writes_.size(); ++k) writes_[k].order = k;
    std::sort(writes_.begin(), writes_.end(), [](const Span& a, const Span& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.order < b.order;
    });
    // Outputs pairwise disjoint: sorted by start, any overlap shows between a span and
    // the one reaching furthest before it.
    for (size_t k = 1, far = 0; k < writes_.size(); ++k) {
      CORE_OPS_CHECK_VALUE(writes_[k].begin >= writes_[far].end, label(writes_[far]), " and ", label(writes_[k]),
                           " share memory, and the op writes both: give each its own memory");
      if (writes_[k].end > writes_[far].end) far = k;
    }
    // Disjoint outputs sorted by start are sorted by end too: the first ending after
    // an input starts is the only one that can overlap it, unless it is the input's
    // in-place partner, which then covers exactly its memory.
    for (const Span& r : reads_) {
      const auto w = std::upper_bound(writes_.begin(), writes_.end(), r.begin,
                                       [](uintptr_t at, const Span& s) { return at < s.end; });
      if (w == writes_.end() || w->begin >= r.end) continue;
      const bool partner = r.in_place_with != nullptr && std::strcmp(r.in_place_with, w->name) == 0 &&
                           r.index == w->index;
      if (partner) {
        CORE_OPS_CHECK_VALUE(w->begin == r.begin && w->end == r.end && w->tensor->sizes().equals(r.tensor->sizes()) &&
                                 same_layout(*w->tensor, *r.tensor),
                             label(*w), " partly overlaps ", label(r),
                             " in memory; write in place (the same tensor) or into separate memory");
        continue;
      }
      raise_value_error(words(label(*w), " shares memory with ", label(r),
                              ": the op reads one while it writes the other, in parallel; ",
                              r.in_place_with != nullptr ? "an output may only be its own input (in place)"
                                                         : "give each its own memory"));
    }
  }

 private:
  static constexpr size_t kScalar = std::numeric_limits<size_t>::max();
  struct Span {
    uintptr_t begin, end;
    const char* name;
    size_t index;  // kScalar for a lone tensor
    const char* in_place_with;
    const Tensor* tensor;
    size_t order = 0;  // place in the call, for ties
  };

  static std::string label(const Span& s) {
    return s.index == kScalar ? std::string(s.name) : words(s.name, "[", s.index, "]");
  }

  static void add(std::vector<Span>& to, const Tensor& t, const char* name, size_t index,
                  const char* in_place_with, bool written) {
    if (non_strided_layout(t) != nullptr) return;  // the op's layout check names it
    const int64_t n = t.numel();
    if (n == 0) return;
    if (!is_dense(t)) {
      if (written) refuse_internal_overlap(t, name, index);
      return;
    }
    const auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
    if (begin == 0) return;  // no memory to share (a tensor subclass holding metadata only)
    to.push_back({begin, begin + static_cast<uintptr_t>(n) * t.element_size(), name, index, in_place_with, &t});
  }

  static void refuse_internal_overlap(const Tensor& t, const char* name, size_t index) {
    const auto sizes = t.sizes();
    const auto strides = t.strides();
    for (size_t d = 0; d < sizes.size(); ++d) {
      CORE_OPS_CHECK_VALUE(sizes[d] <= 1 || strides[d] != 0,
                           label({0, 0, name, index, nullptr, nullptr}),
                           " has elements that share memory (a stride of 0: an expanded tensor?), "
                           "and the op writes it: pass a tensor of its own, e.g. .clone()");
    }
  }

  std::vector<Span> reads_, writes_;
};

}  // namespace core_ops
