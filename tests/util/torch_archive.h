// Test helper: hand-built torch.save archives around a _rebuild_tensor_v2 pickle, for the
// hostile-dump tests of the tensor reader and of replay.
#pragma once

#include <string>
#include <vector>

#include "flashinfer/tensor.h"
#include "formats/pickle_writer.h"
#include "util/zip_writer.h"

namespace flashinfer::testing {

/// A pickle of {"arg_0": _rebuild_tensor_v2(FloatStorage of 16 elements, 0, size, stride)}.
struct PickledTensor {
  std::string name;
  Shape size, stride;
};

/// A torch.save pickle of a dict {name: float tensor over storage "0"} (all share that storage).
inline std::string rebuild_tensors_pickle(const std::vector<PickledTensor>& tensors) {
  formats::PickleWriter pk;
  pk.empty_dict();
  pk.mark();
  for (const PickledTensor& t : tensors) {
    pk.unicode(t.name);
    pk.global("torch._utils", "_rebuild_tensor_v2");
    pk.mark();
    pk.mark();
    pk.unicode("storage");
    pk.global("torch", "FloatStorage");
    pk.unicode("0");
    pk.unicode("cpu");
    pk.integer(16);
    pk.tuple();
    pk.binpersid();
    pk.integer(0);
    pk.int_tuple(t.size);
    pk.int_tuple(t.stride);
    pk.boolean(false);
    pk.global("collections", "OrderedDict");
    pk.empty_tuple();
    pk.reduce();
    pk.tuple();
    pk.reduce();
  }
  pk.setitems();
  return pk.finish();
}

inline std::string rebuild_tensor_pickle(const Shape& size, const Shape& stride) {
  return rebuild_tensors_pickle({{"arg_0", size, stride}});
}

/// Writes `file` as a torch.save zip: `<stem>/data.pkl` = `pkl` and storage 0 = 16 floats of 1.
inline void write_storage_archive(const std::string& file, const std::string& stem,
                                  const std::string& pkl) {
  ZipWriter z(file);
  z.add(stem + "/data.pkl", pkl.data(), pkl.size());
  const std::vector<float> data(16, 1.0f);
  z.add(stem + "/data/0", data.data(), data.size() * sizeof(float));
  z.finish();
}

}  // namespace flashinfer::testing
